"""The verl backend's ``engine`` reference (``eval: {reference: engine, pool: P, rollout: {...}}``):
verl's own validation of a saved checkpoint, run as a job of its own by one fixed engine setting
on one named pool, the same for every arm (verl PR #7519 evaluates every arm of its correction
study with one shared evaluation engine).

The job is a verl run of the grid's shared configuration (the recipe and the grid's fixed
``overrides:``; an arm's own keys do not enter it), with

* the ``rollout`` section replaced by ``eval.rollout`` (the rollout vocabulary; where it leaves
  the engine unset, the evaluation pool's default), and no ``correction`` or ``learner`` section
  (neither enters validation; without them no arm's training settings reach its evaluator);
* ``trainer.val_only`` and ``trainer.val_before_train``: verl 0.9.1 loads the checkpoint
  (``trainer.resume_mode: resume_path``), syncs its weights into the rollout engine, validates
  once, logs at the checkpoint's step and returns (``trainer/ppo/ray_trainer.py`` 1428-1445).

Its core validation metric is read as the trial's own ``eval/reward`` is (``verl/files.py``:
``val-core/<source>/<part>/mean@1``): prompts, reward and averaging are verl's, so any verl
recipe can be scored, not only the in-code task of the ``trainer`` reference. It runs through the
supervision of a trial's attempt (``supervise.run_attempt``): its own Ray, process reaping, and
the engine's provenance read from the running engine, so a setting the engine did not apply
fails the job instead of scoring it. It runs on this machine (``ablate evaluate``), which needs
the evaluation pool's devices: for a gpu pool, run ``ablate evaluate`` on a node of that pool
(e.g. with ``srun`` inside an allocation of it).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator.backends.base import Evaluator, Trainer
from orchestrator.backends.config import TrialConfig
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import (
    BackendUnavailableError,
    CheckpointError,
    InfraFailure,
    UserError,
)
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec
from orchestrator.verl.cpu import reference
from orchestrator.verl.supervise import missing_modules, require_cpu_verl
from orchestrator.verl.topology import world_size

VERSION = "verl-engine-ref-1"  # bump when the job's numbers would change
# Sections of the shared config the job does not take (``rollout`` is the evaluation's own).
DROPPED = ("correction", "learner", "eval", "rollout")
# Arm keys that would make the job load another model or task than the arm trained: refused at
# plan (an arm that trains another model has no shared evaluator to be scored by).
MODEL_KEYS = ("actor_rollout_ref.model.", "assets.")


def job_config(shared: Mapping[str, Any], rollout: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration the evaluation job runs: see the module docstring."""
    config = copy.deepcopy({k: v for k, v in shared.items() if k not in DROPPED})
    config["rollout"] = dict(rollout)
    config["trainer"] = {**(config.get("trainer") or {}), "val_only": True,
                         "val_before_train": True}
    return config


def require_here(pool: PoolSpec, config: Mapping[str, Any], *, where: str) -> None:
    """Raise a one-line ``BackendUnavailableError`` unless this machine can run the job on
    ``pool``, as it runs where ``ablate evaluate`` runs: verl importable (a cpu pool), and for
    a gpu pool its GPUs here, on one node."""
    if pool.kind == "cpu":
        require_cpu_verl([pool], where=where)
        return
    import torch  # deferred: only where a gpu pool's job is about to run

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = world_size(pool, config)
    missing = missing_modules(("verl",))
    if missing or need > pool.gpus_per_node or have < need:
        raise BackendUnavailableError(
            f"{where}: the evaluation job runs on this machine and needs verl and the pool's "
            f"{need} GPU(s) on one node; this machine has {have} GPU(s)"
            + (f" and no {', '.join(missing)}" if missing else "") + "; fix: run `ablate "
            "evaluate` on a node of that pool (e.g. inside an allocation of it)")


def target_problem(target: str, pool: PoolSpec) -> str | None:
    """Why the verl backend cannot score trials on ``pool`` with reference ``target``: the
    ``trainer`` reference is an fp32 forward on this machine's CPU of each checkpoint as it is
    saved (``verl/cpu/reference.py``), so cpu pools only; ``engine`` is this module's job, on
    the evaluation pool whatever the trial's."""
    if target == "engine":
        return None
    if target != "trainer":
        return f"eval.reference: {target} is not a target here"
    if pool.kind != "cpu":
        return (f"eval.reference: {target} on the verl backend runs on the cpu pools only (pool "
                f"{pool.name} is a {pool.kind} pool); fix: use 'reference: engine' with an "
                "evaluation pool (eval.pool), or run the grid on cpu or sim pools")
    return None


def job_problem(trainer: type[Trainer], pool: PoolSpec, rollout: RolloutSpec,
                config: Mapping[str, Any], arm_keys: Iterable[str],
                trial_pools: Iterable[PoolSpec]) -> str | None:
    """Why the job cannot run on evaluation pool ``pool`` with engine settings ``rollout`` for
    the grid's shared ``config`` (``trainer``'s plan checks, as for a trial there), or why an
    arm cannot be scored by it (``arm_keys``: the keys some arm sets itself; ``trial_pools``:
    the pools whose checkpoints it loads, sharded by their world size), or None."""
    for key in arm_keys:
        if key.startswith(MODEL_KEYS):
            return (f"{key} is set per arm, and the engine reference scores every arm with the "
                    "grid's one model and task; fix: set it in overrides: for every arm, or "
                    "use reference: trainer")
    if pool.kind not in trainer.pool_kinds:
        return (f"eval.pool {pool.name} is a {pool.kind} pool, and the evaluation job is a verl "
                f"run; fix: name a {' or '.join(trainer.pool_kinds)} pool")
    job = job_config(config, rollout.model_dump(exclude_none=True))
    world = world_size(pool, job)
    for other in trial_pools:
        saved = world_size(other, config)
        if saved != world:
            return (f"the checkpoints of pool {other.name} hold {saved} FSDP shard(s), and "
                    f"evaluation pool {pool.name} runs {world} rank(s): verl loads shards at the "
                    f"world size they were saved with; fix: an evaluation pool of {saved} "
                    "GPU(s), or trial pools of its size")
    found = trainer.problems(TrialConfig.of(job, pool),
                             stages=frozenset({"combination", "engine"}))
    return f"on evaluation pool {pool.name}: {found[0].reason}" if found else None


@dataclasses.dataclass
class _JobContext:
    """The run context of one evaluation job: it holds what verl logs instead of recording it
    (the trial's own records stay what the trial logged)."""

    trial: TrialSpec
    pool: PoolSpec
    workdir: Path
    log_dir: Path
    checkpoint: Path
    resume_step: int
    grid_dir: Path
    attempt: int = 1
    checkpoint_every: int = -1  # verl's save_freq: the job saves nothing
    metrics: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    facts: dict[str, str] = dataclasses.field(default_factory=dict)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics[step] = dict(metrics)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        raise CheckpointError(f"the evaluation job of step {self.resume_step} saved a "
                              f"checkpoint of step {step}; it only validates")

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoint

    def should_stop(self) -> str | None:
        return None

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        self.facts.update(facts)


def score(trainer: type[Trainer], trial: TrialSpec, shared: Mapping[str, Any], pool: PoolSpec,
          rollout: Mapping[str, Any], checkpoint: Path, step: int, *, grid_dir: Path,
          log_dir: Path, workdir: Path) -> tuple[float, dict[str, Any]]:
    """``eval/reward`` of verl's validation of ``trial``'s checkpoint of ``step`` by the job on
    ``pool`` with engine settings ``rollout`` (run by ``trainer``, the verl backend's), and the
    job's evidence: every validation metric it logged, and its facts (the engine that ran).
    ``workdir``: its scratch (removed after it, with its parent if that is left empty)."""
    config = TrialConfig.of(job_config(shared, rollout), pool)
    job = dataclasses.replace(trial, pool=pool.name, steps=step)
    ctx = _JobContext(job, pool, workdir, log_dir, checkpoint, step, grid_dir)
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        trainer().run(job, config, ctx)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            workdir.parent.rmdir()  # the trial's, if nothing else is in it
    logged = ctx.metrics.get(step, {})
    if M.EVAL_REWARD not in logged:
        raise InfraFailure(f"verl's validation of step {step} logged no {M.EVAL_REWARD} "
                           f"(the recipe's validation data?); see {log_dir}")
    shown = {k: v for k, v in sorted(logged.items()) if k.startswith(("val-", "eval/"))}
    return float(logged[M.EVAL_REWARD]), {"metrics": shown, "facts": ctx.facts}


class VerlEvaluator(Evaluator):
    """The verl trainer's reference evaluators (``backends._EVALUATORS``): the targets it runs
    where (``trainer`` on the cpu pools, scored as each checkpoint is saved; ``engine`` on any,
    this module's job), the engine reference's plan checks, the machine its job needs and the
    job itself."""

    version: ClassVar[str | None] = reference.VERSION
    at_checkpoints: ClassVar[bool] = True
    job_version: ClassVar[str | None] = VERSION
    job_model_keys: ClassVar[tuple[str, ...]] = MODEL_KEYS

    def problem(self, target: str, pool: PoolSpec) -> str | None:
        return target_problem(target, pool)

    def job_problem(self, target: str, pool: PoolSpec, rollout: RolloutSpec,
                    config: Mapping[str, Any], arm_keys: Iterable[str],
                    trial_pools: Iterable[PoolSpec]) -> str | None:
        return job_problem(self.trainer, pool, rollout, config, arm_keys, trial_pools)

    def require_job(self, pool: PoolSpec, config: Mapping[str, Any], *, where: str = "") -> None:
        require_here(pool, config, where=where)

    def score(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
              checkpoint: Path, step: int, target: str) -> float:
        """The fp32 reference score of a stored verl checkpoint (``verl/cpu/reference.py``)."""
        refused = self.problem(target, pool) or reference.recipe_problem(config, target)
        if refused:
            raise UserError(f"trial {trial.trial_id}: {refused}")
        return reference.score(checkpoint, config)

    def score_job(self, trial: TrialSpec, shared: Mapping[str, Any], pool: PoolSpec,
                  rollout: Mapping[str, Any], checkpoint: Path, step: int, *,
                  grid_dir: Path, log_dir: Path, workdir: Path) -> tuple[float, dict[str, Any]]:
        return score(self.trainer, trial, shared, pool, rollout, checkpoint, step,
                     grid_dir=grid_dir, log_dir=log_dir, workdir=workdir)
