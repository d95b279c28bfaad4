"""Ray Tune plumbing of one fit: the ``Tuner`` (``tuner``), the settings Tune takes only from
the environment (``tune_env``), the credentials it would copy into every worker's runtime_env,
and the pickles it leaves behind.

Apart from the submission's stages (``_submission``) because none of this is a decision about
the grid's trials: it is what makes Tune run them the way the stages decided, and it changes
when Ray does.

Tune's own files under ``<grid>/tune/<submission>/``: its experiment state and the searcher
state (``searcher-state-*.pkl``, which holds the gate's JSON despite its name) are written
during the fit and only read by ``Tuner.restore``, which we never call; the per-trial logger
files are off except ``progress.csv``. Tune always pickles the Tuner (``tuner.pkl``) and a
failed trial's exception (``error.pkl``): there is no switch, so ``drop_tune_pickles`` deletes
them after each fit (a SIGKILLed fit can leave them; nothing reads them).

ray is imported by the functions that use it: ``ablate status`` and ``ablate plan`` import this
module without starting anything.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.scheduler._placement import Placement, resource_fn
from orchestrator.scheduler._progress import LiveView
from orchestrator.scheduler._trainable import GridContext, _trainable
from orchestrator.store.workspace import scoped_environ


def tuner(gctx: GridContext, gate: Any, live: LiveView, name: str,
          placements: Mapping[str, Placement], grid_dir: Path, max_failures: int) -> Any:
    """The Tuner of one fit: ``_trainable`` on each trial's pool resources, trials handed out by
    the gate, Tune's failure retries, the live view's callback and Tune's CSV logger only."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback

    return tune.Tuner(
        tune.with_resources(tune.with_parameters(_trainable, gctx=gctx),
                            resource_fn(placements)),
        tune_config=tune.TuneConfig(search_alg=gate, num_samples=-1, reuse_actors=True,
                                    trial_name_creator=_trial_name,
                                    trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(
            name=name, storage_path=str(grid_dir / "tune"), verbose=0,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=[live.callback, CSVLoggerCallback()]),
    )


@contextlib.contextmanager
def tune_env(max_pending: int) -> Iterator[None]:
    """Tune settings that are only environment variables, for the duration of one fit.

    ``TUNE_MAX_PENDING_TRIALS_PG``: with a custom searcher Tune keeps ONE trial pending, so slots
    freed together refill one per actor start-up and a newly starting actor is dropped for a
    cached one; the gate already bounds what is pending (the running ones and the standbys).
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``: no per-trial ``params.pkl``/``params.json``/``result.json``/TensorBoard files (the trial
    records are ours, in JSON); only the CSV logger is added back, for Tune's own result grid.
    ``TUNE_DISABLE_SIGINT_HANDLER``: Ctrl-C is the submission's (``KeyboardInterrupt``: it says
    what ran and exits non-zero); Tune's own handler ends the fit as if it had finished.
    """
    with scoped_environ({"TUNE_MAX_PENDING_TRIALS_PG": str(max_pending),
                         "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
                         "TUNE_DISABLE_SIGINT_HANDLER": "1"}):
        yield


# Ray Tune copies these from the driver's environment into every trainable's runtime_env, and
# Ray's runtime-env agent logs runtime_envs in plain text (session_*/logs/runtime_env_agent.log).
# Credentials reach workers through the node's own environment instead: inherited from this
# process on the embedded cluster, the pod's secrets on KubeRay.
_TUNE_PROPAGATED_CREDENTIALS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"})


def stop_credential_propagation() -> None:
    """Ray Tune copies no cloud credential into a trainable's runtime_env (see above)."""
    from ray.tune.execution import class_cache

    names = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if isinstance(names, (set, frozenset)) and names & _TUNE_PROPAGATED_CREDENTIALS:
        class_cache.ENV_VARS_TO_PROPAGATE = type(names)(names - _TUNE_PROPAGATED_CREDENTIALS)


def drop_tune_pickles(tune_dir: Path) -> None:
    """Tune pickles its Tuner (``tuner.pkl``, for ``Tuner.restore``, which we never use: see
    ``_submission``'s docstring) and errors (``error.pkl``; ``error.txt`` stays). Our state is JSON."""
    for pkl in tune_dir.rglob("*.pkl"):
        pkl.unlink(missing_ok=True)


def _trial_name(trial: Any) -> str:
    """Tune's trial (and directory) name: our trial id, not the whole config."""
    return f"{trial.config.get('trial_id', 'trial')}-{trial.trial_id}"
