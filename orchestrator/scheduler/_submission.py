"""Ray Tune control plane: ``ablate submit``, ``ablate status``, ``ablate cancel``.

One Tune trial per grid trial, placed on its pool by a Ray resource (``pool:<name>`` in the
embedded cluster, ``accelerator_type:<X>`` or the ``ray.io/accelerator-type`` node label on an
existing one): hardware is pinned, never substituted. Concurrency limits and the queue live in
``gate.PoolGate``; one attempt of a trial is ``runner.run_attempt``; infra failures are retried by
Tune's ``FailureConfig`` and resume from the trial's own checkpoint store.

Crash safety does not rest on Tune's experiment restore: ``Tuner.restore`` keeps the old
resources (#15570), can break ``max_concurrent_trials`` (#40652) and cannot take a changed
search space (adding axis values). The trial records are the truth instead: a re-submit expands
the grid again (content-hashed ids), skips finished trials, and every unfinished one resumes
from its latest verified checkpoint; the grid lease and per-trial locks keep it single-run.

Keeping a slot busy: Tune runs trials in reused worker processes (``reuse_actors``); MLflow
writes of an attempt happen in this process (``sender.Sender``), not in the slot, and so does
opening the parent run, beside Ray's start-up; see ``_tune_env``, ``_warm_up`` and the gate's
standby trial for the three ways Tune would otherwise leave a slot idle between short trials.

Tune's own files under ``<grid>/tune/<submission>/``: its experiment state and the searcher
state (``searcher-state-*.pkl``, which holds the gate's JSON despite its name) are written
during the fit and only read by ``Tuner.restore``, which we never call; the per-trial logger
files are off except ``progress.csv``. Tune always pickles the Tuner (``tuner.pkl``) and a
failed trial's exception (``error.pkl``): there is no switch, so ``_drop_tune_pickles`` deletes
them after each fit (a SIGKILLed fit can leave them; nothing reads them).
"""
from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.exceptions import UserError
from orchestrator.scheduler._placement import Placement, connect, plan_placement, resource_fn
from orchestrator.scheduler._search import search_records, store_objectives
from orchestrator.scheduler._trainable import GridContext, _trainable
from orchestrator.store import GridLease, TrialPaths, atomic_write_json, records, workspace
from orchestrator.trial import TrialSpec, TrialState, transition

# --------------------------------------------------------------------------- submit


def _prepare_records(grid_dir: Path, trials: list[TrialSpec]) -> tuple[list[TrialSpec], list[str]]:
    """Write the spec of each trial and reset trials left RUNNING by a dead orchestrator.
    Returns the trials to run and the finished ones (whose outboxes the sender still sends)."""
    todo, finished = [], []
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        records.save_spec(paths, t)
        if not paths.state.exists():  # a new trial: pending on its own pool, nothing to reset
            todo.append(t)
            continue
        with _quiet_trial(paths, t.trial_id):
            rec = records.load_state(paths, t.trial_id)
            if rec.state.is_finished():
                finished.append(t.trial_id)
                continue
            records.load_attempts(paths)  # a corrupt file stops the submit here, not in a Ray worker
            if rec.state is TrialState.RUNNING or rec.pending_reason:
                if rec.state is TrialState.RUNNING:  # its orchestrator died; the runner resumes it
                    rec.state = transition(rec.state, TrialState.PENDING)
                rec.pending_reason = None
                rec.pool = rec.pool or t.pool
                records.save_state(paths, rec)
        todo.append(t)
    return todo, finished


ORPHAN_WAIT_S = 60.0  # how long a submission waits for a dead orchestrator's worker to go


@contextlib.contextmanager
def _quiet_trial(paths: TrialPaths, trial_id: str) -> Iterator[None]:
    """Hold the trial's run lock while its files are read and reset. A worker of an orchestrator
    that was just killed can still be finishing an attempt (Ray stops a dead driver's workers
    within seconds): its last writes land before the state is judged, never after."""
    from filelock import Timeout

    from orchestrator.exceptions import ConcurrencyError

    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=ORPHAN_WAIT_S)
    except Timeout:
        raise ConcurrencyError(f"trial {trial_id} is still run by another process ({paths.run_lock} "
                               f"held for {ORPHAN_WAIT_S:.0f} s); stop that process or wait for "
                               f"it, then submit again") from None
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _tune_env(max_pending: int) -> Iterator[None]:
    """Tune settings that are only environment variables, for the duration of one fit.

    ``TUNE_MAX_PENDING_TRIALS_PG``: with a custom searcher Tune keeps ONE trial pending, so slots
    freed together refill one per actor start-up and a newly starting actor is dropped for a
    cached one; the gate already bounds what is pending (the running ones and the standbys).
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``: no per-trial ``params.pkl``/``params.json``/``result.json``/TensorBoard files (the trial
    records are ours, in JSON); only the CSV logger is added back, for Tune's own result grid.
    """
    from orchestrator.environment import scoped_environ

    with scoped_environ({"TUNE_MAX_PENDING_TRIALS_PG": str(max_pending),
                         "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}):
        yield


# Ray Tune copies these from the driver's environment into every trainable's runtime_env, and
# Ray's runtime-env agent logs runtime_envs in plain text (session_*/logs/runtime_env_agent.log).
# Credentials reach workers through the node's own environment instead: inherited from this
# process on the embedded cluster, the pod's secrets on KubeRay.
_TUNE_PROPAGATED_CREDENTIALS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"})


def _stop_credential_propagation() -> None:
    from ray.tune.execution import class_cache

    names = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if isinstance(names, (set, frozenset)) and names & _TUNE_PROPAGATED_CREDENTIALS:
        class_cache.ENV_VARS_TO_PROPAGATE = type(names)(names - _TUNE_PROPAGATED_CREDENTIALS)


def _drop_tune_pickles(tune_dir: Path) -> None:
    """Tune pickles its Tuner (``tuner.pkl``, for ``Tuner.restore``, which we never use: see the
    module docstring) and errors (``error.pkl``; ``error.txt`` stays). Our state is JSON."""
    for pkl in tune_dir.rglob("*.pkl"):
        pkl.unlink(missing_ok=True)


def submit(grid_path: str, *, backend: str | None = None, address: str | None = None,
           tracking_uri: str | None = None, workdir: str | None = None,
           max_parallel: int | None = None, force: bool = False, progress: bool = True,
           ray_tmp: str | None = None) -> dict[str, Any]:
    """Run a grid (or its search) to the end on Ray Tune; resumes whatever an earlier run left.

    Returns a JSON-safe summary. Raises ``ConcurrencyError`` if the grid runs elsewhere, and
    ``UserError`` for a bad grid, both before anything starts.
    """
    from orchestrator.grid import expand, load_grid

    grid = load_grid(grid_path, backend=backend)
    trials = [] if grid.spec.search is not None else expand(grid, force=force)
    if max_parallel is not None and max_parallel < 1:
        raise UserError(f"--max-parallel {max_parallel}: must be >= 1")
    grid_dir = workspace.grid_dir(grid.name, workdir)
    submission = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    lease = GridLease(grid_dir, grid.name)
    lease.acquire(submission)
    try:
        return _run(grid, trials, grid_dir, submission, address=address,
                    tracking_uri=workspace.tracking_uri(tracking_uri, workdir),
                    root=workspace.workdir(workdir), max_parallel=max_parallel or
                    grid.spec.budget.max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=True)
    finally:
        lease.release()


def run_trials(grid: Any, trials: list[TrialSpec], *, submission: str, address: str | None = None,
               tracking_uri: str | None = None, workdir: str | None = None,
               max_parallel: int | None = None, progress: bool = True,
               ray_tmp: str | None = None) -> dict[str, Any]:
    """Run exactly ``trials`` of ``grid`` on Ray Tune (``ablate resume``, derived trials
    included); the caller holds the grid lease. No automatic rescue round."""
    return _run(grid, list(trials), workspace.grid_dir(grid.name, workdir), submission,
                address=address, tracking_uri=workspace.tracking_uri(tracking_uri, workdir),
                root=workspace.workdir(workdir), max_parallel=max_parallel or
                grid.spec.budget.max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=False)


def _run(grid: Any, trials: list[TrialSpec], grid_dir: Path, submission: str, *,
         address: str | None, tracking_uri: str, root: Path, max_parallel: int, progress: bool,
         ray_tmp: str | None, rescue: bool) -> dict[str, Any]:
    # Tune's own console output would fight the rich live table; our view replaces it.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    from orchestrator.tracking import Sender

    started = time.time()
    # MLflow (parent run, then finished trials' outboxes) works beside Ray and Tune from here on.
    sender = Sender(grid, grid_dir, tracking_uri, root).start()
    ok = False
    try:
        summary = _run_with(grid, trials, grid_dir, submission, sender, started, address=address,
                            max_parallel=max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=rescue)
        ok = True
        return summary
    finally:
        sender.close()
        if not ok and sender.parent is not None:
            sender.parent.end("FAILED")


def _run_with(grid: Any, trials: list[TrialSpec], grid_dir: Path, submission: str, sender: Any,
              started: float, *, address: str | None, max_parallel: int, progress: bool,
              ray_tmp: str | None, rescue: bool) -> dict[str, Any]:
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback

    from orchestrator.backends import _REGISTRY
    from orchestrator.scheduler._gate import PoolGate
    from orchestrator.scheduler._progress import LiveView
    from orchestrator.scheduler._search import SearchSpace
    from orchestrator.tracking import is_remote

    atomic_write_json(grid_dir / "grid.json", {"name": grid.name, "file": str(Path(grid.file).resolve()),
                                               "submission": submission, "submitted_at": started,
                                               "host": socket.gethostname()})
    atomic_write_json(grid_dir / "recipe.json", {"recipe": grid.spec.recipe,
                                                 "config": dict(grid.recipe_config)})
    search = SearchSpace(grid) if grid.spec.search is not None else None
    prior: list[tuple[dict[str, Any], float | None]] = []
    if search is not None:
        trials, prior = search_records(grid_dir)
    records.clear_cancel_requests(grid_dir, ["*"])  # a new submission means: run it
    todo, finished = _prepare_records(grid_dir, trials)
    for tid in finished:  # what an earlier orchestrator left unsent (killed, or the store was down)
        sender.send(tid)
    already = len(finished) + len(prior)  # search points finished by earlier submissions
    trial_pool = {t.trial_id: t.pool for t in todo}
    routes = {t.trial_id: records.route_pool(records.load_state(TrialPaths(grid_dir, t.trial_id),
                                                                t.trial_id), t) for t in todo}
    pool_specs = {p: grid.pools.get(p) for p in set(routes.values()) | set(grid.spec.budget.per_pool)}
    on_collapse = grid.spec.on_collapse if rescue and search is None else None
    if on_collapse is not None and on_collapse.resume.pool:
        # Known before Ray starts: the embedded cluster only has resources for these pools.
        pool_specs[on_collapse.resume.pool] = grid.pools.get(on_collapse.resume.pool)
    if search is not None:
        pool_specs.update({lab: grid.pools.get(lab) for a in grid.axes if a.kind == "pool" for lab in a.labels})
        if grid.spec.pool:
            pool_specs[grid.spec.pool] = grid.pools.get(grid.spec.pool)
    from orchestrator.backends import backend_class

    worker_env = backend_class(grid.backend).worker_env(grid.base_config)
    embedded, owned = connect(address, pool_specs, ray_tmp, worker_env)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        placements = plan_placement(pool_specs, embedded=embedded,
                                    cluster_resources=ray.cluster_resources(),
                                    node_labels=[n.get("Labels") or {} for n in nodes])
        runnable = _park_unplaceable(grid_dir, todo, placements, routes)
        limits = {p: min(pl.capacity, grid.spec.budget.per_pool.get(p, pl.capacity))
                  for p, pl in placements.items()}
        standby = _standby(placements, limits, max_parallel)
        objective = grid.spec.search.objective if search is not None else None
        gctx = GridContext(str(grid_dir), dict(grid.recipe_config), pool_specs, grid.spec.checkpoint,
                           grid.spec.collapse, grid.spec.early_stop_spec, sender.tracking_uri, submission,
                           {grid.backend: _REGISTRY[grid.backend]}, objective)
        budget = 0
        if search is not None:
            budget = max(grid.spec.search.budget - len(prior) - len(runnable), 0)

        def remember(trial: TrialSpec, stored: dict[str, Any]) -> None:
            paths = TrialPaths(grid_dir, trial.trial_id)
            records.save_spec(paths, trial)
            rec = records.load_state(paths, trial.trial_id)
            rec.search, rec.pool = stored, trial.pool
            records.save_state(paths, rec)

        remote_store = is_remote(sender.tracking_uri)

        def hold_for_store() -> bool:
            # A remote store may turn out unreachable: no trial starts before the parent run is
            # open (the callback then stops Tune with the store's error). A local SQLite file
            # cannot be "down", so there trials start while it opens.
            return remote_store and sender.ready_target() is None and sender.error is None

        def fit(runnable: list[TrialSpec], routes: Mapping[str, str], budget: int, name: str) -> Any:
            # How many workers the fit starts at once: the slots of the pools it will use.
            pools = set(limits) if budget else {routes.get(t.trial_id, t.pool) for t in runnable}
            workers = min(max_parallel, sum(limits.get(p, 0) for p in pools), len(runnable) + budget)
            warm_up = [str(grid_dir / "tune" / name / ".workers"), workers]

            def extra_config() -> dict[str, Any]:
                target = sender.ready_target()  # None while the parent run is being opened
                tracking = {"tracking": [target.experiment_id, target.parent_run_id]} if target else {}
                return {"warm_up": warm_up, **tracking}

            gate = PoolGate(grid_dir, runnable, limits, max_parallel, search=search, search_budget=budget,
                            on_new_trial=remember, extra_config=extra_config, standby=standby,
                            hold=hold_for_store,
                            routes={t: p for t, p in routes.items() if p != trial_pool.get(t)})
            for stored, value in prior:
                gate.tell_previous(stored, value)
            live = LiveView(grid_dir, grid.name, gate, progress, on_trial_over=sender.send,
                            abort=lambda: sender.error)
            _stop_credential_propagation()
            try:
                with _tune_env(max_parallel + sum(standby.values())):
                    tune.Tuner(
                        tune.with_resources(tune.with_parameters(_trainable, gctx=gctx),
                                            resource_fn(placements)),
                        tune_config=tune.TuneConfig(search_alg=gate, num_samples=-1, reuse_actors=True,
                                                    trial_name_creator=_trial_name,
                                                    trial_dirname_creator=_trial_name),
                        run_config=tune.RunConfig(
                            name=name, storage_path=str(grid_dir / "tune"), verbose=0,
                            failure_config=tune.FailureConfig(max_failures=grid.spec.retries.max),
                            callbacks=[live.callback, CSVLoggerCallback()]),
                    ).fit()
            except Exception:
                if sender.error is not None:  # the store is unreachable: the callback stopped Tune
                    raise sender.error from None
                raise
            finally:
                live.stop()
                _drop_tune_pickles(grid_dir / "tune" / name)
            sender.drain()  # run ids in state.json before anything below reads them
            _mark_exhausted(grid_dir, gate.errors, sender.tracking_uri)
            return gate

        gate = fit(runnable, routes, budget, submission)
        if search is not None:
            store_objectives(grid_dir, gate.results)
        rescued: list[TrialSpec] = []
        if on_collapse is not None:
            # `on_collapse: {resume: ...}`: one automatic rescue round, under this lease.
            from orchestrator.scheduler._rescue import auto_rescue

            rescued = auto_rescue(grid, grid_dir, [t.trial_id for t in trials])
            if rescued:
                again = {t.trial_id: records.route_pool(records.load_state(
                    TrialPaths(grid_dir, t.trial_id), t.trial_id), t) for t in rescued}
                fit(_park_unplaceable(grid_dir, rescued, placements, again), again, 0,
                    submission + "-rescue")
        parent = sender.wait()
        sender.drain()
        summary = summarize(grid, grid_dir, trials_of(grid_dir, search is not None, trials))
        summary["rescued"] = [t.trial_id for t in rescued]
        summary.update(submission=submission, elapsed_s=round(time.time() - started, 2),
                       skipped_finished=already, tune_dir=str(grid_dir / "tune" / submission),
                       tracking_uri=sender.tracking_uri, parent_run_id=parent.run_id,
                       ray="embedded" if embedded else "cluster")
        parent.end("FINISHED")
        return summary
    finally:
        if owned:
            ray.shutdown()


def _standby(placements: Mapping[str, Placement], limits: Mapping[str, int],
             max_parallel: int) -> dict[str, int]:
    """One standby trial (``gate.PoolGate``) for each pool that Ray itself keeps at its limit,
    when the grid limit cannot be reached by the pool limits anyway."""
    if sum(limits.values()) > max_parallel:
        return {}
    return {p: 1 for p, pl in placements.items() if pl.enforced and 0 < limits[p] == pl.capacity}


def _trial_name(trial: Any) -> str:
    """Tune's trial (and directory) name: our trial id, not the whole config."""
    return f"{trial.config.get('trial_id', 'trial')}-{trial.trial_id}"


def _park_unplaceable(grid_dir: Path, todo: list[TrialSpec], placements: Mapping[str, Placement],
                      routes: Mapping[str, str]) -> list[TrialSpec]:
    """Trials whose pool has no capacity stay PENDING with the reason, instead of hanging Tune."""
    runnable = []
    for t in todo:
        reason = placements[routes.get(t.trial_id, t.pool)].reason
        if reason is None:
            runnable.append(t)
            continue
        paths = TrialPaths(grid_dir, t.trial_id)
        rec = records.load_state(paths, t.trial_id)
        rec.pending_reason = "not started: " + reason
        records.save_state(paths, rec)
    return runnable


def _mark_exhausted(grid_dir: Path, trial_ids: set[str], tracking_uri: str) -> None:
    """Trials Tune gave up on (retries.max infra failures) end FAILED with their last error,
    on disk and in MLflow (their runs would otherwise stay RUNNING there)."""
    import logging

    for tid in trial_ids:
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        if rec.state.is_finished():
            continue
        attempts = records.load_attempts(paths)
        reason = (attempts[-1].reason if attempts else None) or rec.error or "infra failure"
        rec.state = transition(rec.state, TrialState.FAILED)
        rec.error = f"retries exhausted after {len(attempts)} attempts: {reason}"
        rec.verdict = {"kind": "infra_failure", "step": rec.last_step, "reason": rec.error}
        records.save_state(paths, rec)
        if rec.mlflow_run_id:
            try:
                from orchestrator.tracking import client

                mlc = client(tracking_uri)
                for key, value in (("verdict", "infra_failure"), ("verdict.reason", rec.error[:4000]),
                                   ("verdict.step", str(rec.last_step))):
                    mlc.set_tag(rec.mlflow_run_id, key, value)
                mlc.set_terminated(rec.mlflow_run_id, "FAILED")
            except Exception as exc:  # noqa: BLE001 - the record on disk is what counts
                logging.getLogger(__name__).warning("trial %s: MLflow not updated: %s", tid, exc)


def trials_of(grid_dir: Path, search: bool, trials: list[TrialSpec]) -> list[str]:
    if not search:
        return [t.trial_id for t in trials]
    return [p.parent.name for p in sorted((grid_dir / "trials").glob("*/spec.json"))
            if records.load_state(TrialPaths(grid_dir, p.parent.name), p.parent.name).search]


def summarize(grid: Any, grid_dir: Path, trial_ids: list[str]) -> dict[str, Any]:
    """Counts by state and verdict, the pending trials with reasons, the search's best point."""
    states: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    pending, failed, best = [], [], None
    for tid in trial_ids:
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        states[rec.state.value] = states.get(rec.state.value, 0) + 1
        if rec.verdict:
            verdicts[rec.verdict["kind"]] = verdicts.get(rec.verdict["kind"], 0) + 1
        if not rec.state.is_finished():
            pending.append({"trial_id": tid, "pool": rec.pool, "reason": rec.pending_reason or rec.error})
        if rec.state is TrialState.FAILED:
            failed.append({"trial_id": tid, "reason": rec.error})
        if rec.search is not None and rec.objective is not None and math.isfinite(rec.objective):
            mode = grid.spec.search.objective.mode
            if best is None or (rec.objective > best["objective"]) == (mode == "max"):
                best = {"trial_id": tid, "objective": rec.objective, **rec.search}
    out = {"grid": grid.name, "trials": len(trial_ids), "states": states, "verdicts": verdicts,
           "pending": pending, "failed": failed, "grid_dir": str(grid_dir)}
    if grid.spec.search is not None:
        out["search"] = {"budget": grid.spec.search.budget, "best": best}
    return out
