"""What one attempt is given (``AttemptJob``) and what it holds while it runs
(``AttemptState``: the trial's files, checkpoint store, record, verdict engine and the rows on
their way to MLflow).

Apart from what the attempt does with that state (``_commits``: MLflow; ``_start``: the start
step and the rewind; ``_attempt``: the ``RunContext`` and the endings) so each of those reads
against one list of fields.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from orchestrator.backends import Backend, TrialConfig
from orchestrator.grid import warning_stops
from orchestrator.pools import PoolSpec
from orchestrator.schema import CheckpointSpec, CollapseSpec, EarlyStopSpec, RescueEntry
from orchestrator.store import CheckpointStore, ResumeRequest, TrialPaths, records
from orchestrator.tracking import TrackingTarget
from orchestrator.trial import Attempt, TrialSpec
from orchestrator.verdict import VerdictEngine


@dataclasses.dataclass(frozen=True)
class AttemptJob:
    """Everything one attempt needs; plain data so Ray can ship it to a worker."""

    grid_dir: str
    trial: TrialSpec
    config: TrialConfig  # on the pool this attempt runs on (`ablate resume` may move a trial)
    checkpoint: CheckpointSpec
    collapse: CollapseSpec
    early_stop: EarlyStopSpec
    tracking: TrackingTarget | None
    submission: str
    backend_ref: Backend  # trainer and launcher by name: resolved by the driver, imported here
    start: str | int = "latest"  # "latest" checkpoint, "fresh", or an explicit step
    reopen: bool = False  # run even if the trial is finished (`ablate resume`, `run-trial --fresh`)
    defer_tracking: bool = False  # fill the outbox only; the orchestrator sends it (tracking.Sender)
    lock_timeout: float = 120.0
    tracking_every: int = 1  # grid `tracking.every`: MLflow's share of the steps (``commit``)
    rescue: tuple[RescueEntry, ...] = ()  # the grid's rescue policy: a warning it acts on stops the trial

    @property
    def pool(self) -> PoolSpec:
        """The pool this attempt runs on (may differ from ``trial.pool`` after a move)."""
        return self.config.pool


class AttemptState:
    """State of one running attempt; ``AttemptRun`` (``_attempt``) is what runs it."""

    def __init__(self, job: AttemptJob) -> None:
        self.job = job
        self.grid_dir = Path(job.grid_dir)
        self.paths = TrialPaths(self.grid_dir, job.trial.trial_id)
        self.store = CheckpointStore.for_trial(job.checkpoint.store, self.paths.root,
                                               job.trial.trial_id, job.checkpoint.keep)
        self.record = records.load_state(self.paths, job.trial.trial_id)
        # Default rules on metrics this configuration never emits are recorded as not
        # applicable, not run (a rule that cannot fire would pass without a check).
        self.engine = VerdictEngine(job.collapse, job.early_stop, job.trial.steps,
                                    unemitted=job.backend_ref.unemitted(job.config))
        # Warnings the grid's rescue policy acts on for this trial: it stops when one fires.
        self.stop_on = warning_stops(job.rescue, self.record)
        self.rescue_stop: tuple[str, int] | None = None  # (warning, its onset step) it stopped on
        self.warned = self.paths.warning.exists()  # its first warning is on record (alerts)
        self.tracker: Any = None
        self.pending: list[tuple[int, dict[str, float]]] = []  # logged locally, not yet in MLflow
        self.last_values: dict[str, float] = {}
        self.last_step = 0
        self.stop_reason: str | None = None
        self.cancelled = False
        self._cancel_checked = 0.0
        self._metrics_fh: Any = None
        self._prev_keys: frozenset[str] = frozenset()  # metric names of the last row committed
        # Set by prepare(); until it has created the attempt record, ``started`` is False.
        self.resume_step: int | None = None  # the checkpoint this attempt starts from
        self.number = 0  # this attempt's number (1-based)
        self.attempt: Attempt | None = None  # this attempt's record
        self.attempts: list[Attempt] = []  # every attempt of the trial, this one last
        self.request: ResumeRequest | None = None  # why this attempt runs (`ablate resume`)
        self.kept_rows: list[tuple[int, dict[str, float]]] = []  # metrics.jsonl up to the start
        self.tail: list[tuple[int, dict[str, float]]] = []  # rows after it that MLflow held
        self.timing: dict[str, float] = {}  # orchestration cost of the attempt (result.json)

    def rescue_warning(self) -> tuple[str, int] | None:
        """The first warning in ``stop_on`` that has fired, with its onset step: the early
        warning's, or an ``unstable`` rule's firing. A rescue's trial does not stop on a warning
        whose onset is at or before its first step: that one is its parent's, inherited with
        the steps before it, and already rescued (by this very trial)."""
        fired = []
        start = (self.record.rescue_of or {}).get("step")
        if "early_warning" in self.stop_on and self.engine.warning_step is not None:
            fired.append(("early_warning", self.engine.warning_step))
        for rule in self.engine.rules:
            if rule.spec.name in self.stop_on and rule.firing is not None:
                fired.append((rule.spec.name, rule.firing.onset))
        fired = [f for f in fired if start is None or f[1] > start]
        return min(fired, key=lambda f: f[1]) if fired else None

    @property
    def started(self) -> bool:
        """The attempt has a record: its end (or failure) must be recorded too."""
        return self.attempt is not None

    @property
    def scratch(self) -> Path:
        """The backend's scratch directory for this attempt (removed when the trial ends)."""
        return self.paths.root / "work" / f"attempt-{self.number}"
