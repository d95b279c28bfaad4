"""The two contracts a grid's ``backend:`` pairs, and the context a running attempt sees.

A ``Trainer`` is what trains (the simulator, verl): what it accepts at plan time, which metrics
it emits, the environment its processes need, and one attempt of a trial. A ``Launcher`` is
where that attempt runs (this process, a Kubernetes RayJob, a Slurm job): what this machine
needs to launch there, its own plan-time checks, and the watch over the attempt.

Shared work (metrics persistence and MLflow, checkpoint store and retention, verdicts and early
stop, attempt records) lives above both, in ``orchestrator.run``; a trainer only trains,
reports metrics through ``ctx.log_metrics``, saves checkpoints through ``ctx.save_checkpoint``
and polls ``ctx.should_stop``.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from orchestrator import metrics as M
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import BackendUnavailableError
from orchestrator.learner import LearnerSpec
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.backends.config import TrialConfig


class AttemptOutcome(enum.Enum):
    COMPLETED = "completed"  # reached trial.steps
    STOPPED = "stopped"  # ctx.should_stop() asked it to stop (early stop or cancel)
    NUMERIC_FAILURE = "numeric_failure"  # NaN/inf: a result, not retried


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    outcome: AttemptOutcome
    last_step: int  # last step whose metrics were logged
    reason: str | None = None
    summary: Mapping[str, float] = dataclasses.field(default_factory=dict)


class RunContext(Protocol):
    """What a trainer (or the launcher running it) may use while it runs one attempt."""

    trial: TrialSpec
    pool: PoolSpec
    attempt: int
    workdir: Path  # scratch space of this attempt (removed when the trial ends)
    log_dir: Path  # kept with the trial: logs and evidence of the attempt's job, per attempt
    checkpoint_every: int
    resume_step: int | None  # step of the checkpoint to start from, or None for a fresh start

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the metrics of one finished step (steps are 1-based and strictly increasing)."""

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        """Write a checkpoint of the state after ``step``: ``write(dir)`` fills a fresh directory."""

    def checkpoint_path(self, step: int) -> Path:
        """Directory of an existing, verified checkpoint (used to resume from ``resume_step``)."""

    def should_stop(self) -> str | None:
        """A reason to stop now (early stop, cancel), or None to go on."""

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        """Record where this attempt computes (numeric environment, library versions): kept in
        the attempt record and set as tags on the trial's MLflow run."""


class Trainer(abc.ABC):
    """Trains attempts of trials. Subclasses set ``name``, ``version`` and ``pool_kinds``."""

    name: ClassVar[str]
    version: ClassVar[str]  # part of every trial id: bump it when results would change
    # The kinds of pool (``orchestrator/pools.yaml``: sim, gpu, cpu) this trainer runs on, its
    # main kind first. Grid validation and `ablate resume --pool` read it; nothing restates it.
    pool_kinds: ClassVar[tuple[str, ...]]
    # True where an attempt submits its own job to a cluster the pool names (Miles' Ray job
    # server) and the Tune trial only watches it: as for a launcher that computes elsewhere,
    # the embedded local Ray then hosts the pool's watchers, up to the pool's capacity.
    computes_elsewhere: ClassVar[bool] = False

    @classmethod
    def check(cls, correction: CorrectionSpec, rollout: RolloutSpec, pool: PoolSpec) -> str | None:
        """Plan-time refusal: a reason this trainer cannot run the combination, or None."""
        return None

    @classmethod
    def check_pool(cls, pool: PoolSpec) -> tuple[str, str] | None:
        """Plan-time refusal of a pool's own settings in the catalogue (e.g. a simulator
        profile): (the pool key, the reason), or None. By default none."""
        return None

    @classmethod
    def check_learner(cls, learner: LearnerSpec, correction: CorrectionSpec,
                      rollout: RolloutSpec, pool: PoolSpec) -> str | None:
        """Plan-time refusal of the ``learner.*`` settings (``orchestrator/learner.py``) with
        this correction and engine on ``pool``. By default a trainer maps none of them, so any
        setting is refused: a trainer that does not say what it runs must not run it."""
        set_keys = ", ".join(f"learner.{k}: {v}" for k, v in learner.non_default().items())
        if set_keys:
            return (f"{set_keys}: backend {cls.name!r} does not map the learner vocabulary; "
                    "fix: drop it, or use the sim or verl backend")
        return None

    @classmethod
    def check_values(cls, items: Iterable[tuple[str, Any]], config: Mapping[str, Any],
                     pool: PoolSpec) -> str | None:
        """Plan-time refusal of recipe-leaf values a grid sets (``items``; ``config`` is the
        whole resolved config): a reason ``"key: problem"``, or None. By default none."""
        return None

    @classmethod
    def check_config(cls, config: Mapping[str, Any], pool: PoolSpec) -> str | None:
        """Plan-time refusal of a trial's whole resolved config on ``pool`` (verl: a model too
        large for a cpu pool's memory): a reason ``"key: problem; fix: ..."``, or None."""
        return None

    @classmethod
    def check_engine(cls, rollout: RolloutSpec, config: Mapping[str, Any],
                     pool: PoolSpec) -> str | None:
        """Plan-time refusal of engine flags once the trial's whole config is known (verl: the
        rollout engine defaults to the recipe's), or None. By default none."""
        return None

    @classmethod
    def check_reference(cls, target: str, pool: PoolSpec) -> str | None:
        """Why this trainer cannot score ``pool``'s trials with the reference evaluator
        ``target`` (``eval: {reference: ...}``, ``orchestrator/evaluation.py``), or None. By
        default none can: a trainer that does not run one must not pretend to."""
        return (f"backend {cls.name!r} has no reference evaluator; fix: drop eval.reference, "
                "or use the sim backend")

    @classmethod
    def check_reference_job(cls, target: str, pool: PoolSpec, rollout: RolloutSpec,
                            config: Mapping[str, Any], arm_keys: Iterable[str],
                            trial_pools: Iterable[PoolSpec]) -> str | None:
        """Why this trainer cannot run the evaluation job of reference ``target`` on ``pool``
        (``eval.pool``) with engine settings ``rollout`` (``eval.rollout``) for the grid's
        shared ``config``, or score arms that set ``arm_keys`` themselves, or load checkpoints
        saved on ``trial_pools``; None if it can. By default it runs none."""
        return (f"pool {pool.name} runs backend {cls.name!r}, which has no evaluation job; "
                "fix: name a cpu or gpu pool of the verl backend")

    # The version of the reference evaluator(s) this trainer runs, recorded with every score it
    # makes after the fact (``store.reference``); None: it runs none.
    reference_version: ClassVar[str | None] = None
    # True: the trial's evals cannot run the reference in-process (verl evaluates through the
    # trial's own engine), so the runner scores each checkpoint as it is saved, with
    # :meth:`evaluate_checkpoint`, into ``reference.json`` (``run/_attempt.py``).
    reference_at_checkpoints: ClassVar[bool] = False

    def evaluate_checkpoint(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                            checkpoint: Path, step: int, target: str) -> float:
        """The reference evaluator ``target``'s score of the checkpoint of ``step`` of ``trial``
        (``ablate evaluate``): the number the trial would have logged as ``eval/reward_ref`` at
        that step. Only trainers whose :meth:`check_reference` accepts ``target``."""
        raise NotImplementedError(f"backend {self.name!r} has no reference evaluator")

    # A reference that is a job of its own: the version of that job, recorded with its scores
    # (``evaluation.job_evaluator``), and the config keys that name the model it loads (an arm
    # that sets one trained another model than the job loads: it is not scored).
    reference_job_version: ClassVar[str | None] = None
    job_model_keys: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def require_job(cls, pool: PoolSpec, config: Mapping[str, Any], *, where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (one line starting with ``where``) unless this
        machine runs the evaluation job on ``pool`` (``ablate evaluate`` runs it here)."""
        raise BackendUnavailableError(f"{where}: backend {cls.name!r} has no evaluation job")

    def evaluate_job(self, trial: TrialSpec, shared: Mapping[str, Any], pool: PoolSpec,
                     rollout: Mapping[str, Any], checkpoint: Path, step: int, *,
                     grid_dir: Path, log_dir: Path, workdir: Path) -> tuple[float, dict[str, Any]]:
        """A reference that is a job of its own (``evaluation.reference_job``): the score of the
        checkpoint of ``step`` by the job on evaluation pool ``pool`` with engine settings
        ``rollout``, run on the grid's ``shared`` config, and the job's evidence (JSON). Only
        trainers whose :meth:`check_reference_job` accepts the pool (plan refuses the others); by
        default a one-line refusal, as :meth:`require_job` gives before any job."""
        raise BackendUnavailableError(f"backend {self.name!r} has no evaluation job; fix: name "
                                      "a cpu or gpu pool of the verl backend as eval.pool")

    @classmethod
    def check_checkpoint(cls, checkpoint: Path, pool: PoolSpec, config: Mapping[str, Any],
                         others: Iterable[PoolSpec]) -> str | None:
        """Why the stored checkpoint ``checkpoint`` cannot resume on ``pool`` (``ablate resume
        --pool``; ``others``: the grid's pools), or None. By default a checkpoint holds the
        whole state, so it resumes on any pool this trainer runs on."""
        return None

    @classmethod
    def require(cls, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (one line starting with ``where``, e.g. the grid
        file and key, then what to install) if this machine cannot run this trainer's trials on
        ``pools`` itself. The local launcher calls it before anything starts. By default every
        machine can."""

    @classmethod
    def describe(cls, trial: TrialSpec, config: TrialConfig) -> list[str]:
        """What ``ablate plan --show-overrides`` prints for a trial: by default its overrides as
        ``key=JSON`` lines (verl: the exact Hydra override list of its job)."""
        return [f"{k}={json.dumps(v, default=list)}" for k, v in trial.overrides]

    @classmethod
    def job(cls, config: TrialConfig) -> TrainerJob | None:
        """The job a launcher that computes elsewhere (a Kubernetes RayJob, a Slurm
        allocation's size) asks about: None where this trainer's attempts run only through
        :meth:`run`, in the launcher's own process (the simulator)."""
        return None

    @classmethod
    def worker_env(cls, config: Mapping[str, Any]) -> dict[str, str | None]:
        """Environment variables the processes that run this trainer's trials must start with
        (None: unset), e.g. the simulator's pinned numerics. Applied before Ray starts its
        workers, and before an in-process trial imports anything heavy."""
        return {}

    @classmethod
    def never_emitted(cls) -> frozenset[str]:
        """Names of ``orchestrator/metrics.py``'s vocabulary this trainer never reports."""
        return frozenset()

    @classmethod
    def unemitted(cls, correction: CorrectionSpec, rollout: RolloutSpec,
                  learner: LearnerSpec, config: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Metrics of :meth:`reported` that a trial of this configuration never emits, each with
        why: a grid's own collapse rule or search objective on one of them could never fire for
        it, so the grid is refused at plan (``grid/_expansion``), and a default rule on one is
        recorded as not applicable to the trial (``verdict.VerdictEngine``). ``config``: the
        trial's resolved recipe, for what its other sections decide (verl: evaluation); None
        where only the three sections are known. By default what every trainer's IS correction
        shares (the simulator's ``sim/correction_math.is_weights`` and verl's
        ``rollout_corr_helper.compute_rollout_correction_weights``): the masked share only in
        mask mode (IcePop), the batch-normalisation factor only with batch normalisation, both
        only with an IS level; and the loss scaler's metrics only for an fp16 learner (the
        simulator's ``LossScaler`` and verl's ``ShardedGradScaler`` exist only there)."""
        out: dict[str, str] = {}
        if learner.precision != "fp16":
            out[M.SKIPPED_SHARE] = out[M.LOSS_SCALE] = (
                "it is emitted only with learner.precision: fp16 (the only learner with a loss "
                "scaler, which skips updates)")
        if correction.is_level == "none" or correction.is_mode != "mask":
            out[M.IS_MASKED_FRACTION] = ("it is IcePop's masked share, emitted only with "
                                         "correction.is_mode: mask and an is_level")
        if correction.is_level == "none" or not correction.batch_norm:
            out[M.IS_BATCH_NORM] = ("it is emitted only with correction.batch_norm: true and "
                                    "an is_level")
        return out

    @classmethod
    def reported(cls, name: str) -> bool:
        """Whether this trainer can ever report metric ``name`` (``*``: any): by default the
        vocabulary's names but :meth:`never_emitted`. A collapse rule on another name could
        never fire."""
        if name == "*":
            return True
        return name not in cls.never_emitted() and name in M.vocabulary()

    @abc.abstractmethod
    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        """Run one attempt of ``trial`` (from ``ctx.resume_step`` if set) until done or stopped."""


class MetricReader(Protocol):
    """A job's metrics as it writes them, read while it runs (the steps after the last read)."""

    def poll(self) -> list[tuple[int, dict[str, float]]]:
        """The steps written completely since the last call, in order."""

    def flush(self) -> list[tuple[int, dict[str, float]]]:
        """Once the job ended: the steps still held back (a last step without a newline)."""


class TrainerJob(abc.ABC):
    """A trial's job as a launcher that runs it outside this process sees it: what to run, how
    large it is, where its metrics and checkpoints appear. Built by :meth:`Trainer.job` from the
    trial's configuration, so a launcher imports no trainer package."""

    # The rollout engine the job runs (the image it needs), or None where it runs none.
    engine: str | None
    # Accelerators the job spans (the nodes a launcher asks for: world_size / gpus_per_node).
    world_size: int

    @abc.abstractmethod
    def command(self, trial: TrialSpec, *, checkpoint_dir: str, resume_path: str | None = None,
                save_freq: int | None = None) -> list[str]:
        """argv of one attempt's job (never a shell string), saving checkpoints under
        ``checkpoint_dir`` every ``save_freq`` steps, resuming from ``resume_path``."""

    @abc.abstractmethod
    def environment(self, trial: TrialSpec, *, tracking_uri: str | None, run_id: str | None,
                    file_logger_path: str) -> dict[str, str | None]:
        """The job's environment (None: unset), its metrics written to ``file_logger_path``."""

    @abc.abstractmethod
    def metrics(self, path: Path, last_logged: int) -> MetricReader:
        """A reader of the metrics the job writes to ``path``, after step ``last_logged``."""

    @abc.abstractmethod
    def resume_path(self, ctx: RunContext, checkpoint_dir: Path) -> str | None:
        """Lay the checkpoint of ``ctx.resume_step`` out under ``checkpoint_dir`` as the job
        reads it, and return what to pass as ``resume_path`` (None: a fresh start)."""

    @abc.abstractmethod
    def hand_over(self, ctx: RunContext, checkpoint_dir: Path, saved: int, logged: int) -> int:
        """Give the checkpoints the job saved under ``checkpoint_dir`` up to step ``logged`` to
        ``ctx.save_checkpoint``, after step ``saved``; returns the last step handed over."""


class ProbeJob(abc.ABC):
    """A trainer's probe (``ablate probe``, ``orchestrator/probe``): the mismatch of one
    configuration at its first step, no update. Registered per trainer name beside the trainers
    (``backends._PROBES``); a trainer without one has its configurations refused, one line each.
    Rows are JSON-ready dicts (they are cached as they are): one per (seed, batch)."""

    version: ClassVar[str]  # part of every probe's content hash: bump when numbers would change
    # The probe's figures (``probe._plan.METRICS`` keys, or ``buckets``) this trainer cannot
    # measure -> why: reported as not measured, never estimated.
    unmeasured: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def check(cls, config: Mapping[str, Any], pool: PoolSpec) -> str | None:
        """Why this configuration cannot be probed, or None (checked before anything runs)."""
        return None

    @classmethod
    @abc.abstractmethod
    def identity(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, Any]:
        """What decides the configuration's step-1 mismatch (engine, its flags and version,
        the trainer's precision and log-prob settings, model, prompts), JSON-ready: two
        configurations with one identity share a probe (correction and optimizer do not enter)."""

    @classmethod
    def knobs(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, str]:
        """``--attribute``'s knobs of this configuration: name -> the change its probe makes."""
        return {}

    @abc.abstractmethod
    def run(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
            seeds: list[int], batches: int) -> tuple[list[dict[str, float]], dict[str, Any]]:
        """Rows of the configuration's probe (metric -> value, with ``seed`` and ``batch``) and
        the engine settings the engine applied."""

    @abc.abstractmethod
    def run_knobs(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                  seeds: list[int], batches: int,
                  knobs: list[str]) -> dict[str, list[dict[str, float]]]:
        """Per knob of ``knobs``, paired rows: ``k3`` of the configuration and ``k3_without``
        with that knob turned (the rest as they are)."""


class Launcher(abc.ABC):
    """Runs a trainer's attempt somewhere. Subclasses set ``name``."""

    name: ClassVar[str]
    # Part of a trial id where the launcher changes the job (a wrapper around the trainer):
    # None where the job is exactly the trainer's own, so its trials share the trainer's ids.
    version: ClassVar[str | None] = None
    # The pool kinds this launcher places, in the order it names them; None: every kind its
    # trainers run on.
    pool_kinds: ClassVar[tuple[str, ...] | None] = None
    # True where a trial computes outside Ray (a Slurm job) and its Tune trial only watches:
    # the embedded local Ray then hosts any pool's watchers, up to the pool's capacity.
    computes_elsewhere: ClassVar[bool] = False
    # False where the orchestrator that stores a grid's checkpoints runs elsewhere (k8s: in the
    # control RayCluster), so ``ablate plan`` here cannot check the checkpoint store.
    stores_here: ClassVar[bool] = True

    @classmethod
    def require(cls, trainer: type[Trainer], pools: Iterable[PoolSpec], *,
                where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (or a one-line ``UserError``) if this machine cannot
        launch ``trainer``'s trials on ``pools``. ``ablate submit``, ``resume`` and ``run-trial``
        call it before anything starts. By default every machine can."""

    @classmethod
    def check_pool(cls, pool: PoolSpec) -> tuple[str, str] | None:
        """Plan-time refusal of a pool's own launcher settings in the catalogue (Slurm: an
        ``extra`` option the launcher sets itself): (the pool key, the reason), or None."""
        return None

    @classmethod
    def check_config(cls, trainer: type[Trainer], config: TrialConfig) -> str | None:
        """Plan-time refusal of a trial's placement (Slurm: its pool's nodes and ``slurm:``
        block; ``trainer``: the one that runs it), checked before the trainer's own
        ``check_config``; by default none."""
        return None

    @classmethod
    def describe(cls, trial: TrialSpec, pool: PoolSpec) -> list[str]:
        """Lines ``ablate plan --show-overrides`` prints before the trainer's (Slurm: the
        ``#SBATCH`` options); by default none."""
        return []

    @classmethod
    def worker_env(cls, trainer: type[Trainer],
                   config: Mapping[str, Any]) -> dict[str, str | None]:
        """The environment the orchestrator's workers start with: by default the trainer's
        (it trains in them); a launcher whose job trains elsewhere sets it there instead."""
        return trainer.worker_env(config)

    @classmethod
    def dry_run(cls, grid_path: str, *, out_dir: str | None, force: bool,
                workdir: str | None, backend: str) -> int | None:
        """``ablate submit --dry-run``: write what a submission would hand the cluster (every
        trial's manifest or job script) for inspection and submit nothing, the grid planned as
        ``backend`` (a registered name with this launcher); the exit status, or None where this
        launcher hands nothing over (it runs attempts here)."""
        return None

    @classmethod
    def abandon(cls, trial_id: str, log_dir: Path) -> None:
        """Stop what this launcher may have left running for a trial that no orchestrator runs
        any more (``ablate cancel`` after a killed ``ablate submit``): e.g. its Slurm job. By
        default a trial's work dies with the orchestrator's workers, so nothing."""

    @abc.abstractmethod
    def run(self, trainer: Trainer, trial: TrialSpec, config: TrialConfig,
            ctx: RunContext) -> AttemptResult:
        """Run one attempt of ``trial`` with ``trainer`` until done or stopped."""
