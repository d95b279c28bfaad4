"""The backend interface every backend implements, and the context a running attempt sees.

Shared work (metrics persistence and MLflow, checkpoint store and retention, verdicts and early
stop, attempt records) lives above the backend, in ``orchestrator.run``; a backend only
trains, reports metrics through ``ctx.log_metrics``, saves checkpoints through
``ctx.save_checkpoint`` and polls ``ctx.should_stop``.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.learner import LearnerSpec
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec


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
    """What a backend may use while it runs one attempt."""

    trial: TrialSpec
    pool: PoolSpec
    attempt: int
    workdir: Path  # scratch space of this attempt (removed when the trial ends)
    log_dir: Path  # kept with the trial: logs and evidence of the backend's job, per attempt
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


class Backend(abc.ABC):
    """Runs attempts of trials. Subclasses set ``name``, ``version`` and ``pool_kinds``."""

    name: ClassVar[str]
    version: ClassVar[str]  # part of every trial id: bump it when results would change
    # The kinds of pool (``orchestrator/pools.yaml``: sim, gpu, cpu) this backend runs on, its
    # main kind first. Grid validation and `ablate resume --pool` read it; nothing restates it.
    pool_kinds: ClassVar[tuple[str, ...]]
    # True where a trial computes outside Ray (a Slurm job) and its Tune trial only watches:
    # the embedded local Ray then hosts any pool's watchers, up to the pool's capacity.
    computes_elsewhere: ClassVar[bool] = False

    @classmethod
    def check(cls, correction: CorrectionSpec, rollout: RolloutSpec, pool: PoolSpec) -> str | None:
        """Plan-time refusal: a reason this backend cannot run the combination, or None."""
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
        this correction and engine on ``pool``. By default a backend maps none of them, so any
        setting is refused: a backend that does not say what it runs must not run it."""
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
    def require(cls, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """Raise ``BackendUnavailableError`` (one line starting with ``where``, e.g. the grid
        file and key, then what to install) if this machine cannot launch trials on ``pools``.
        ``ablate submit``, ``resume`` and ``run-trial`` call it before anything starts. By
        default every machine can."""

    @classmethod
    def describe(cls, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec) -> list[str]:
        """What ``ablate plan --show-overrides`` prints for a trial: by default its overrides as
        ``key=JSON`` lines (verl: the exact Hydra override list of its job)."""
        return [f"{k}={json.dumps(v, default=list)}" for k, v in trial.overrides]

    @classmethod
    def worker_env(cls, config: Mapping[str, Any]) -> dict[str, str | None]:
        """Environment variables the processes that run this backend's trials must start with
        (None: unset), e.g. the simulator's pinned numerics. Applied before Ray starts its
        workers, and before an in-process trial imports anything heavy."""
        return {}

    @classmethod
    def abandon(cls, trial_id: str, log_dir: Path) -> None:
        """Stop what this backend may have left running for a trial that no orchestrator runs
        any more (``ablate cancel`` after a killed ``ablate submit``): e.g. its Slurm job. By
        default a trial's work dies with the orchestrator's workers, so nothing."""

    @abc.abstractmethod
    def run(self, trial: TrialSpec, config: Mapping[str, Any], ctx: RunContext) -> AttemptResult:
        """Run one attempt of ``trial`` (from ``ctx.resume_step`` if set) until done or stopped."""
