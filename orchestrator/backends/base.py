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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from orchestrator import metrics as M
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import BackendUnavailableError
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.backends.config import TrialConfig
    from orchestrator.backends.short import ShortJob


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


# What a plan-time problem is about, in the order a grid is checked (``Trainer.problems``):
# a catalogue pool's own settings; the correction/rollout/learner sections on the pool; the
# engine's flags once the whole config is known (verl: the recipe names the engine); recipe
# leaves the grid sets; the whole resolved config on the pool (its placement first); a stored
# checkpoint a trial would resume from there (``ablate resume --pool``, ``ablate evaluate``).
STAGES = ("pool", "combination", "engine", "values", "config", "checkpoint")
PLAN = frozenset(STAGES) - {"checkpoint"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One reason a trial cannot run on a pool: its stage (:data:`STAGES`), one line (``"key:
    problem; fix: ..."`` where it is about a key), and for a ``pool`` problem the pool's key
    in the catalogue."""

    stage: str
    reason: str
    key: str | None = None


def problem(stage: str, reason: str | None, key: str | None = None) -> list[Problem]:
    """``[Problem(stage, reason, key)]``, or ``[]`` where ``reason`` is None."""
    return [] if reason is None else [Problem(stage, reason, key)]


@dataclasses.dataclass(frozen=True)
class Emits:
    """What a trainer reports: every name of ``orchestrator/metrics.py``'s vocabulary but
    ``never``, anything under ``namespaces`` (verl's file logger passes its own through), and
    for one configuration the names it does not emit (``unemitted``: name -> why)."""

    never: frozenset[str] = frozenset()
    namespaces: tuple[str, ...] = ()
    unemitted: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def reports(self, name: str) -> bool:
        """Whether the trainer can ever report ``name`` (``*``: any). A collapse rule on
        another name could never fire."""
        return name == "*" or (name not in self.never
                               and (name in M.vocabulary() or name.startswith(self.namespaces)))


class Trainer(abc.ABC):
    """Trains attempts of trials. Subclasses set ``name``, ``version`` and ``pool_kinds`` (its
    identity) and answer five questions besides :meth:`run`: a trial's problems on a pool,
    what it emits, the environment its processes need, whether this machine runs it, and the
    job a launcher that computes elsewhere runs. A trainer's reference evaluator and probe are
    registered beside it (``backends._EVALUATORS``, ``backends._PROBES``)."""

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
    def problems(cls, config: TrialConfig, *, stages: frozenset[str] = PLAN,
                 given: Iterable[tuple[str, Any]] = (), checkpoint: Path | None = None,
                 others: Iterable[PoolSpec] = ()) -> list[Problem]:
        """Every reason this trainer cannot run a trial of ``config`` on ``config.pool``, of
        the asked ``stages`` (:data:`STAGES`), in the order it checks them: ``given`` are the
        recipe leaves the grid sets (``values``), ``checkpoint`` the stored checkpoint it would
        resume from and ``others`` the grid's pools (``checkpoint``). By default a trainer maps
        no ``learner.*`` setting, so any is refused: a trainer that does not say what it runs
        must not run it. A checkpoint holds the whole state, so it resumes on any pool."""
        learner = config.learner.non_default()
        if "combination" not in stages or not learner:
            return []
        keys = ", ".join(f"learner.{k}: {v}" for k, v in learner.items())
        return problem("combination", f"{keys}: backend {cls.name!r} does not map the learner "
                       "vocabulary; fix: drop it, or use the sim or verl backend")

    @classmethod
    def emits(cls, config: TrialConfig | None = None) -> Emits:
        """What this trainer reports, and what a trial of ``config`` does not (None: no
        configuration asked). By default the vocabulary, and for a configuration what every
        trainer's IS correction shares (the simulator's ``sim/correction_math.is_weights`` and
        verl's ``rollout_corr_helper.compute_rollout_correction_weights``): the masked share
        only in mask mode (IcePop), the batch-normalisation factor only with batch
        normalisation, both only with an IS level; and the loss scaler's metrics only for an
        fp16 learner (the simulator's ``LossScaler`` and verl's ``ShardedGradScaler`` exist
        only there). A grid's own collapse rule or search objective on an unemitted metric
        could never fire for the trial, so the grid is refused at plan (``grid/_expansion``),
        and a default rule on one is recorded as not applicable (``verdict.VerdictEngine``)."""
        out: dict[str, str] = {}
        if config is None:
            return Emits()
        correction, learner = config.correction, config.learner
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
        return Emits(unemitted=out)

    @classmethod
    def environment(cls, config: Mapping[str, Any]) -> dict[str, str | None]:
        """Environment variables the processes that run this trainer's trials must start with
        (None: unset), e.g. the simulator's pinned numerics. Applied before Ray starts its
        workers, and before an in-process trial imports anything heavy."""
        return {}

    @classmethod
    def require(cls, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (one line starting with ``where``, e.g. the grid
        file and key, then what to install) if this machine cannot run this trainer's trials on
        ``pools`` itself. The local launcher calls it before anything starts. By default every
        machine can."""

    @classmethod
    def job(cls, config: TrialConfig) -> TrainerJob | None:
        """The job a launcher that computes elsewhere (a Kubernetes RayJob, a Slurm
        allocation's size) asks about, and ``ablate plan --show-overrides`` prints: None where
        this trainer's attempts run only through :meth:`run`, in the launcher's own process
        (the simulator)."""
        return None

    @abc.abstractmethod
    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        """Run one attempt of ``trial`` (from ``ctx.resume_step`` if set) until done or stopped."""


class Evaluator:
    """A trainer's reference evaluator(s) (``eval: {reference: ...}``,
    ``orchestrator/evaluation.py``), registered by trainer name (``backends._EVALUATORS``). This
    base is a trainer's that has none: it refuses every reference, one line each."""

    # The version of the in-process reference, recorded with every score it makes after the
    # fact (``store.reference``); None: it runs none.
    version: ClassVar[str | None] = None
    # True: the trial's evals cannot run the reference in-process (verl evaluates through the
    # trial's own engine), so the runner scores each checkpoint as it is saved, with
    # :meth:`score`, into ``reference.json`` (``run/_attempt.py``).
    at_checkpoints: ClassVar[bool] = False
    # A reference that is a job of its own: the version of that job, recorded with its scores
    # (``evaluation.job_evaluator``), and the config keys that name the model it loads (an arm
    # that sets one trained another model than the job loads: it is not scored).
    job_version: ClassVar[str | None] = None
    job_model_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, trainer: type[Trainer]) -> None:
        self.trainer = trainer

    def problem(self, target: str, pool: PoolSpec) -> str | None:
        """Why ``pool``'s trials cannot be scored with reference ``target``, or None."""
        return (f"backend {self.trainer.name!r} has no reference evaluator; fix: drop "
                "eval.reference, or use the sim backend")

    def job_problem(self, target: str, pool: PoolSpec, rollout: RolloutSpec,
                    config: Mapping[str, Any], arm_keys: Iterable[str],
                    trial_pools: Iterable[PoolSpec]) -> str | None:
        """Why the evaluation job of reference ``target`` cannot run on ``pool`` (``eval.pool``)
        with engine settings ``rollout`` (``eval.rollout``) for the grid's shared ``config``,
        or score arms that set ``arm_keys`` themselves, or load checkpoints saved on
        ``trial_pools``; None if it can."""
        return (f"pool {pool.name} runs backend {self.trainer.name!r}, which has no evaluation "
                "job; fix: name a cpu or gpu pool of the verl backend")

    def require_job(self, pool: PoolSpec, config: Mapping[str, Any], *, where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (one line starting with ``where``) unless this
        machine runs the evaluation job on ``pool`` (``ablate evaluate`` runs it here)."""
        raise BackendUnavailableError(f"{where}: backend {self.trainer.name!r} has no "
                                      "evaluation job")

    def score(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
              checkpoint: Path, step: int, target: str) -> float:
        """Reference ``target``'s score of the checkpoint of ``step`` of ``trial`` (``ablate
        evaluate``): the number the trial would have logged as ``eval/reward_ref`` at that
        step. Only where :meth:`problem` accepts ``target``."""
        raise NotImplementedError(f"backend {self.trainer.name!r} has no reference evaluator")

    def score_job(self, trial: TrialSpec, shared: Mapping[str, Any], pool: PoolSpec,
                  rollout: Mapping[str, Any], checkpoint: Path, step: int, *,
                  grid_dir: Path, log_dir: Path, workdir: Path) -> tuple[float, dict[str, Any]]:
        """A reference that is a job of its own (``evaluation.reference_job``): the score of the
        checkpoint of ``step`` by the job on evaluation pool ``pool`` with engine settings
        ``rollout``, run on the grid's ``shared`` config, and the job's evidence (JSON). Only
        where :meth:`job_problem` accepts the pool (plan refuses the others); by default a
        one-line refusal, as :meth:`require_job` gives before any job."""
        raise BackendUnavailableError(f"backend {self.trainer.name!r} has no evaluation job; "
                                      "fix: name a cpu or gpu pool of the verl backend as "
                                      "eval.pool")


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
    def describe(self, trial: TrialSpec) -> list[str]:
        """What ``ablate plan --show-overrides`` prints for ``trial`` (verl: the exact Hydra
        override list of its job; Miles: train.py's arguments)."""

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
        """Per knob of ``knobs``, rows per (seed, batch): ``k3_without``, the k3 with that knob
        turned (the rest as they are), and ``k3`` of the configuration where the job measures it
        beside (else the configuration's own probe rows of the same seed and batch pair with it)."""


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
    def problems(cls, trainer: type[Trainer], config: TrialConfig, *,
                 stages: frozenset[str] = PLAN) -> list[Problem]:
        """Plan-time refusals of a trial's placement by this launcher (``trainer``: the one that
        runs it), as :meth:`Trainer.problems` gives them and checked before the trainer's: a
        pool's own launcher settings in the catalogue (``pool``; Slurm: an ``extra`` option the
        launcher sets itself), the pool's nodes for the trial (``config``; Slurm: its nodes and
        ``slurm:`` block). By default none."""
        return []

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
        return trainer.environment(config)

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

    @classmethod
    def run_short(cls, jobs: Sequence[ShortJob], *, parallel: int,
                  limits: Mapping[str, int]) -> None:
        """Run ``jobs`` (work that is not a trial's attempt: a probe's, ``backends.short``) to
        their end where their pools' trials run, at most ``parallel`` at once and
        ``limits[pool]`` of one pool; each leaves its result or raises (``check_ended``). By
        default in this process, one after another, as the local launcher's trials run here."""
        for job in jobs:
            job.run_here()

    @abc.abstractmethod
    def run(self, trainer: Trainer, trial: TrialSpec, config: TrialConfig,
            ctx: RunContext) -> AttemptResult:
        """Run one attempt of ``trial`` with ``trainer`` until done or stopped."""
