"""One attempt of one trial: its files, checkpoints, verdict engine and MLflow commits.

``AttemptRun`` is the state of a running attempt and the ``RunContext`` a backend sees; the
runner (``_runner``) takes the trial's lock, builds one, runs the backend and ends it. The rules
it keeps (commit on checkpoint, replacing a run MLflow holds too far) are in the runner's module
docstring. Tracking is deferred while the attempt is young (``tracking._deferred``): the outbox
is filled here and sent by the orchestrator.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends import AttemptOutcome, AttemptResult, Backend
from orchestrator.cost import pool_rate
from orchestrator.pools import PoolSpec
from orchestrator.run._tracked import tracked_rows, verdict_steps
from orchestrator.schema import CheckpointSpec, CollapseSpec, EarlyStopSpec
from orchestrator.store import (
    CheckpointStore,
    ResumeRequest,
    TrialPaths,
    atomic_write_json,
    records,
)
from orchestrator.store.summary import write_summary
from orchestrator.tracking import DeferredRun, TrackingTarget, TrialRun, drain, supersede
from orchestrator.trial import Attempt, TrialSpec, TrialState, transition
from orchestrator.verdict import VerdictEngine

log = logging.getLogger(__name__)
_OUTCOME = {AttemptOutcome.COMPLETED: "completed", AttemptOutcome.STOPPED: "stopped",
            AttemptOutcome.NUMERIC_FAILURE: "numeric_failure"}
# Attempt outcomes that end the trial (its state becomes DONE, CANCELLED or FAILED right after).
_ENDING = ("completed", "stopped_early", "numeric_failure", "cancelled", "error")


@dataclasses.dataclass(frozen=True)
class AttemptJob:
    """Everything one attempt needs; plain data so Ray can ship it to a worker."""

    grid_dir: str
    trial: TrialSpec
    config: Mapping[str, Any]
    pool: PoolSpec  # may differ from trial.pool when `ablate resume` moves a trial
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


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception as exc:  # noqa: BLE001 - outside Ray the hostname is the best we have
        log.debug("no Ray node id: %s", exc)
    return f"local:{socket.gethostname()}"


class AttemptContext:
    """The RunContext a backend sees during one attempt."""

    def __init__(self, attempt: AttemptRun) -> None:
        self._a = attempt
        self.trial = attempt.job.trial
        self.pool = attempt.job.pool
        self.attempt = attempt.number
        self.workdir = attempt.scratch
        self.log_dir = attempt.paths.root / "logs"
        self.checkpoint_every = attempt.job.checkpoint.every
        self.resume_step = attempt.resume_step

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._a.log_metrics(step, metrics)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        self._a.save_checkpoint(step, write)

    def checkpoint_path(self, step: int) -> Path:
        return self._a.store.path(step)

    def should_stop(self) -> str | None:
        return self._a.should_stop()

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        self._a.describe_environment(facts)


class AttemptRun:
    """State of one running attempt; see the module docstring for the rules it keeps."""

    def __init__(self, job: AttemptJob) -> None:
        self.job = job
        self.grid_dir = Path(job.grid_dir)
        self.paths = TrialPaths(self.grid_dir, job.trial.trial_id)
        self.store = CheckpointStore.for_trial(job.checkpoint.store, self.paths.root,
                                               job.trial.trial_id, job.checkpoint.keep)
        self.record = records.load_state(self.paths, job.trial.trial_id)
        self.engine = VerdictEngine(job.collapse, job.early_stop, job.trial.steps)
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

    @property
    def started(self) -> bool:
        """The attempt has a record: its end (or failure) must be recorded too."""
        return self.attempt is not None

    @property
    def scratch(self) -> Path:
        """The backend's scratch directory for this attempt (removed when the trial ends)."""
        return self.paths.root / "work" / f"attempt-{self.number}"

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Pick the start step, close the earlier attempts, rewind the trial's files to that
        step, open tracking and record this attempt as running."""
        self.resume_step = self._start_step()
        start = self.resume_step or 0
        file_rows = list(records.iter_metrics(self.paths.metrics))
        attempts, redo = self._earlier_attempts(file_rows[-1][0] if file_rows else 0)
        self._rewind(start, file_rows)
        self.request = self.record.resume
        if redo is not None:
            self.attempt = dataclasses.replace(redo, outcome=None, reason=None, end_step=None,
                                               ended_at=None)
        else:
            accelerators, unit = pool_rate(self.job.pool)
            self.attempt = Attempt(number=self.number, pool=self.job.pool.name,
                                   start_step=start + 1, resumed_from_step=self.resume_step,
                                   started_at=time.time(), node=_node_id(),
                                   submission=self.job.submission, accelerators=accelerators,
                                   unit=unit)
        self.attempts = attempts + [self.attempt]
        records.save_attempts(self.paths, self.attempts)
        self._open_tracking()
        self._mark_running(start)

    def _earlier_attempts(self, last_on_disk: int) -> tuple[list[Attempt], Attempt | None]:
        """The trial's earlier attempts, with those whose process died unrecorded closed as infra
        failures, and the ended attempt this one finishes instead of following (or None); sets
        ``number``."""
        job = self.job
        attempts = records.load_attempts(self.paths)
        for i, a in enumerate(attempts):
            if a.outcome is None:  # the process running it died without writing its end
                why = ("orchestrator stopped while this attempt ran"
                       if a.submission != job.submission else
                       "worker process died without a record (killed, OOM or node lost)")
                attempts[i] = dataclasses.replace(a, outcome="infra_failure", reason=why,
                                                  end_step=max(last_on_disk, a.start_step - 1),
                                                  ended_at=self._died_at(a))
        self.number = len(attempts) + 1
        ended = attempts[-1] if attempts and attempts[-1].outcome in _ENDING else None
        if ended is not None and not job.reopen and job.start != "fresh" and self.record.resume is None:
            # Its process wrote the attempt's end but died before the trial's state did (the two
            # files cannot change in one write): this is that attempt finishing from its last
            # checkpoint, not a new one (a "completed" trial must not show two completions).
            self.number = ended.number
            return attempts[:-1], ended
        return attempts, None

    def _died_at(self, a: Attempt) -> float | None:
        """When an attempt that died unrecorded stopped computing: its last metrics row (the
        file's modification time), for its cost (``orchestrator.cost``)."""
        try:
            mtime = self.paths.metrics.stat().st_mtime
        except OSError:
            return a.started_at
        return max(mtime, a.started_at) if a.started_at is not None else mtime

    def _rewind(self, start: int, file_rows: list[tuple[int, dict[str, float]]]) -> None:
        """Bring the trial's files back to step ``start`` and the verdict engine up to it."""
        job, paths = self.job, self.paths
        if job.start != "fresh" and self.record.committed_step > start:
            # Resuming before what MLflow holds (`ablate resume --from`): the steps after the
            # checkpoint are replaced. Keep them (the collapse they show) before truncating.
            self.tail = [(s, m) for s, m in file_rows if s > start]
            records.write_metrics(paths.root / "superseded" / f"attempt-{self.number}.jsonl", self.tail)
        if self.resume_step is not None:
            self.store.drop_after(self.resume_step)  # the abandoned branch's checkpoints
        self.kept_rows = records.truncate_metrics(paths.metrics, start)
        if job.start == "fresh":
            self.record = records.TrialRecord(trial_id=job.trial.trial_id)
        for step, row in self.kept_rows:
            reason = self.engine.observe(step, row)
            self.stop_reason = self.stop_reason or reason
            self.last_values.update(row)
        self.pending = [(s, m) for s, m in self.kept_rows if s > self.record.committed_step]
        self.last_step = start

    def _mark_running(self, start: int) -> None:
        """The trial's state says this attempt runs (its resume request consumed); the attempt's
        scratch directory, metrics file and ``running.json`` are open."""
        self.record.state = _to_running(self.record.state)
        self.record.pool = self.job.pool.name
        self.record.attempts = self.number
        self.record.pending_reason = self.record.error = self.record.resume = None
        self.record.metrics_stamp = None  # the file changes from here on
        self.record.last_step = start
        records.save_state(self.paths, self.record)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._metrics_fh = open(self.paths.metrics, "a")  # noqa: SIM115 - closed in finish()
        # Where the attempt runs right now (for `ablate status` and for fault-injection tests).
        assert self.attempt is not None
        atomic_write_json(self.paths.root / "running.json", {
            "pid": os.getpid(), "node": self.attempt.node, "attempt": self.number,
            "started_at": self.attempt.started_at})

    def _start_step(self) -> int | None:
        start = self.job.start
        request = self.record.resume
        if start == "latest" and request is not None and request.start is not None:
            start = request.start  # `ablate resume --from STEP`, consumed by this attempt
        if start == "fresh":
            self.store.clear()  # a later crash must not resume from the discarded run
            return None
        if start == "latest":
            return self.store.latest()
        self.store.path(int(start))  # raises CheckpointError, before anything is written
        return int(start)

    def _open_tracking(self) -> None:
        target = self.job.tracking
        start = self.resume_step or 0
        if target is None:
            self.record.committed_step = min(self.record.committed_step, start)
            return
        outbox = self.paths.outbox
        old = self.record.mlflow_run_id
        # MLflow cannot delete metric points, so a run that already holds steps after the resume
        # point is replaced by a fresh one, refilled from metrics.jsonl (see scheduler/_resume.py).
        replace = self.record.committed_step > start and self.job.start != "fresh"
        if (self.job.start == "fresh" or replace) and outbox.exists():
            drain(outbox, target.uri, timeout=10)  # the old run gets what it was owed, then a new run
            shutil.rmtree(outbox)
        if replace:
            self.record.mlflow_run_id, self.record.committed_step = None, 0
            self.record.superseded_runs = [*self.record.superseded_runs, *([old] if old else [])]
            self.pending = list(self.kept_rows)
        if self.job.defer_tracking and not replace and self.job.start != "fresh" \
                and not self.record.superseded_runs:
            self.tracker = DeferredRun(self.job.trial, outbox, run_id=self.record.mlflow_run_id)
        else:
            self.tracker = self._live_tracker(self.record.mlflow_run_id)
        if replace or self.record.mlflow_run_id != self.tracker.run_id:
            self.record.mlflow_run_id = self.tracker.run_id
            records.save_state(self.paths, self.record)
        if replace:
            self.tracker.outbox.add_artifact(f"superseded-{old or 'unsent'}.json", {
                "run_id": old, "replaced_from_step": start + 1, "by_attempt": self.number,
                "rows": [{"step": s, "metrics": m} for s, m in self.tail]})
        if self.tracker.run_id is not None:
            for run_id in self.record.superseded_runs:  # again next attempt if the store was down
                supersede(target.uri, run_id, self.tracker.run_id)
        self.commit(start)  # steps up to the checkpoint are final (the refill of a new run)
        tags = {"supersedes": ",".join(self.record.superseded_runs)} if self.record.superseded_runs else {}
        if self.request is not None and self.request.reason:
            tags.update({"resume.reason": str(self.request.reason), "resume.from_step": str(start),
                         "resume.pool": str(self.request.pool or self.job.pool.name)})
        if tags:
            self.tracker.set_tags(tags)
        if len(self.attempts) > 1:
            # A resumed trial shows its attempts (pools, step ranges) while it runs; a first
            # attempt is recorded at its end (one MLflow write less per trial).
            self.tracker.log_attempts(self.attempts)

    def _live_tracker(self, run_id: str | None) -> Any:
        target = self.job.tracking
        assert target is not None
        return TrialRun(target.uri, target.experiment_id, target.parent_run_id, self.job.trial,
                        self.job.pool, run_id=run_id, buffer_dir=self.paths.outbox)

    def _maybe_go_live(self) -> None:
        """A deferred attempt that runs long enough to matter switches to a live MLflow run."""
        target = self.job.tracking
        assert self.attempt is not None
        if (not isinstance(self.tracker, DeferredRun) or target is None or not target.experiment_id
                or time.time() - self.attempt.started_at < DeferredRun.LIVE_AFTER_S):
            return
        self.tracker = self._live_tracker(self.tracker.run_id)  # sends what the outbox holds
        self.record.mlflow_run_id = self.tracker.run_id

    # ------------------------------------------------------------------ MLflow commits

    def commit(self, upto: int, *, save: bool = True) -> None:
        """Send metrics up to ``upto`` to MLflow and record how far MLflow now goes.

        A crash between the two leaves ``committed_step`` behind; the next attempt sends those
        rows again and the tracking outbox drops every step it already holds, so nothing is
        logged twice (``tracking._outbox.Outbox.add_rows``).
        """
        rows = [(s, m) for s, m in self.pending if self.record.committed_step < s <= upto]
        self.pending = [(s, m) for s, m in self.pending if s > upto]
        if not rows:
            return
        every = self.job.tracking_every
        if every > 1:
            # `tracking.every`: the N-th steps, this commit's last step, and every step the
            # verdict can name. An onset a rule reports later is the start of a streak that is
            # running now, so `verdict_steps` taken at each commit keeps it before it is sent
            # (the store takes steps in order only).
            rows, self._prev_keys = tracked_rows(rows, every, verdict_steps(self.engine), self._prev_keys)
        if self.tracker is not None:
            self._maybe_go_live()
            self.tracker.log(rows)
        self.record.committed_step = rows[-1][0]
        self.record.last_step = self.last_step
        if save:
            records.save_state(self.paths, self.record)

    # ------------------------------------------------------------------ RunContext

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if step <= self.last_step:
            raise ValueError(f"trial {self.job.trial.trial_id}: step {step} logged after step "
                             f"{self.last_step}; steps must strictly increase")
        row = {k: float(v) for k, v in metrics.items()}
        self._metrics_fh.write(records.metric_line(step, row))
        self._metrics_fh.flush()
        self.last_step = step
        self.last_values.update(row)
        if step > self.record.committed_step:
            self.pending.append((step, row))
        reason = self.engine.observe(step, row)
        if reason and self.stop_reason is None:
            self.stop_reason = reason

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        if step > self.last_step:
            raise ValueError(f"trial {self.job.trial.trial_id}: checkpoint of step {step} before "
                             f"its metrics were logged (last step {self.last_step})")
        self.store.save(step, write)
        os.fsync(self._metrics_fh.fileno())  # the rows the checkpoint covers are durable first
        self.commit(step)
        if self.stop_reason is None and self.engine.warning_step is None:
            # The two newest checkpoints taken while the trial looked healthy survive retention:
            # a rule fires `patience` steps after the collapse began, so the newest may already
            # be past the onset, and `ablate resume --from last-healthy` needs one before it.
            older = [s for s in self.store.protected() if s < step]
            self.store.protect(older[-1:] + [step])
        self.store.prune()

    def should_stop(self) -> str | None:
        if self.stop_reason is not None:
            return self.stop_reason
        now = time.monotonic()
        if now - self._cancel_checked > 0.5:
            self._cancel_checked = now
            if self.job.trial.trial_id in records.cancel_requests(self.grid_dir):
                self.cancelled = True
                self.stop_reason = "cancelled by `ablate cancel`"
        return self.stop_reason

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        """Keep ``facts`` with this attempt (attempts.json) and tag the MLflow run with them."""
        self.attempt = dataclasses.replace(self.attempt, environment=dict(facts))
        self.attempts[-1] = self.attempt
        records.save_attempts(self.paths, self.attempts)
        if self.tracker is not None:
            self.tracker.set_tags(dict(facts))

    # ------------------------------------------------------------------ endings

    def _end_attempt(self, outcome: str, reason: str | None) -> None:
        self.attempt = dataclasses.replace(self.attempt, end_step=self.last_step, outcome=outcome,
                                           reason=reason, ended_at=time.time())
        self.attempts[-1] = self.attempt
        records.save_attempts(self.paths, self.attempts)
        (self.paths.root / "running.json").unlink(missing_ok=True)
        if self._metrics_fh is not None:
            self._metrics_fh.close()
            self._metrics_fh = None

    def finish(self, result: AttemptResult) -> dict[str, Any]:
        """A normal end (completed, stopped early, cancelled, numeric failure): a result (the
        caller writes it to ``result.json``)."""
        self.last_step = max(self.last_step, result.last_step)
        outcome = _OUTCOME[result.outcome]
        if outcome == "stopped" and self.cancelled:
            outcome = "cancelled"
        reason = result.reason or (self.stop_reason if outcome != "completed" else None)
        self._end_attempt("stopped_early" if outcome == "stopped" else outcome, reason)
        self.commit(self.last_step, save=False)  # saved with the end state just below
        verdict = self.engine.verdict(self.last_step, outcome, reason)
        state = TrialState.CANCELLED if outcome == "cancelled" else TrialState.DONE
        self.record.state = transition(self.record.state, state)
        self.record.verdict = verdict.to_json()
        self.record.last_step = self.last_step
        # One check of the closed file now, so readers of the grid need not parse it again.
        trial_summary = write_summary(self.paths, self.last_step)
        self.record.metrics_stamp = trial_summary.stamp.to_json()
        records.save_state(self.paths, self.record)
        summary = {**self.last_values, **{k: float(v) for k, v in result.summary.items()}}
        out = {"trial_id": self.job.trial.trial_id, "state": state.value, "outcome": outcome,
               "last_step": self.last_step, "attempt": self.number, "verdict": verdict.to_json(),
               "node": self.attempt.node, "summary": summary}
        if self.tracker is not None:
            self.tracker.set_tags(trial_summary.tags())
            self.tracker.set_verdict(verdict)
            self.tracker.log_attempts(self.attempts)
            self.tracker.flush(30.0)
            self.tracker.end("KILLED" if state is TrialState.CANCELLED else "FINISHED")
        if outcome == "cancelled":
            records.clear_cancel_requests(self.grid_dir, [self.job.trial.trial_id])
        shutil.rmtree(self.paths.root / "work", ignore_errors=True)
        return out

    def fail(self, exc: BaseException, *, retriable: bool) -> None:
        """Record a failed attempt. Retriable failures go back to PENDING for Tune to retry."""
        reason = f"{type(exc).__name__}: {exc}"[:1000]
        self.record.error = reason
        self.record.last_step = self.last_step
        if retriable:
            self.record.state = transition(self.record.state, TrialState.PENDING)
        else:
            self.record.state = transition(self.record.state, TrialState.FAILED)
            self.record.verdict = self.engine.verdict(self.last_step, "infra_failure", reason).to_json()
        try:
            self._end_attempt("infra_failure" if retriable else "error", reason)
            records.save_state(self.paths, self.record)
        except OSError as write_error:
            # A full disk takes the record too; the next submission closes this attempt as an
            # infra failure (its outcome is missing) and resumes from the last checkpoint.
            log.warning("trial %s: failure not recorded (%s): %s", self.job.trial.trial_id,
                        write_error, reason)
            return
        if self.tracker is not None:
            try:
                self.tracker.log_attempts(self.attempts)
                if not retriable:
                    self.commit(self.last_step)
                    self.tracker.set_verdict(self.engine.verdict(self.last_step, "infra_failure", reason))
                    self.tracker.end("FAILED")
                self.tracker.flush(10.0)
            except Exception:
                log.exception("trial %s: tracking update after failure failed", self.job.trial.trial_id)


def _to_running(state: TrialState) -> TrialState:
    """The legal path to RUNNING: a reopened finished trial and a stale RUNNING one (its
    process died unrecorded) pass through PENDING first."""
    if state.is_finished():
        state = transition(state, TrialState.PENDING, resume=True)  # `ablate resume`, --fresh
    elif state is TrialState.RUNNING:
        state = transition(state, TrialState.PENDING)
    return transition(state, TrialState.RUNNING)
