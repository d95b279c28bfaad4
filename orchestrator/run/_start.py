"""The start of an attempt: its start step picked, the earlier attempts closed (one whose
process died unrecorded as an infra failure), the trial's files and the verdict engine rewound
to that step, and the attempt recorded as running.

Apart from the ``RunContext`` and the endings (``_attempt``) because this runs once, before the
backend starts, and holds every rule about what a resume sees.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time

from orchestrator.cost import pool_rate
from orchestrator.run._commits import AttemptCommits
from orchestrator.store import atomic_write_json, records
from orchestrator.store.reference import drop_reference_after
from orchestrator.trial import Attempt, TrialState, transition

log = logging.getLogger(__name__)
# Attempt outcomes that end the trial (its state becomes DONE, CANCELLED or FAILED right after).
_ENDING = ("completed", "stopped_early", "numeric_failure", "cancelled", "error")


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception as exc:  # noqa: BLE001 - outside Ray the hostname is the best we have
        log.debug("no Ray node id: %s", exc)
    return f"local:{socket.gethostname()}"


class AttemptStart(AttemptCommits):
    """``prepare``: everything before the backend runs (see the module docstring)."""

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
        if (ended is not None and not job.reopen and job.start != "fresh"
                and self.record.resume is None
                and (self.record.attempts == ended.number
                     or (ended.end_step or 0) >= job.trial.steps)):
            # Its process wrote the attempt's end but died before the trial's state did (the two
            # files cannot change in one write): this is that attempt finishing from its last
            # checkpoint, not a new one (a "completed" trial must not show two completions).
            # A state that does not know the attempt (its state.json removed after damage, a
            # fresh record) is no such state, unless the attempt reached the trial's last step
            # (nothing is left to run: it is finished again); else what runs is a new attempt.
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
        drop_reference_after(paths, start)  # and their reference scores (fresh: all of them)
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
            self.paths.warning.unlink(missing_ok=True)  # nor its warning stand for this run's
            self.warned = False
            return None
        if start == "latest":
            return self.store.latest()
        self.store.path(int(start))  # raises CheckpointError, before anything is written
        return int(start)


def _to_running(state: TrialState) -> TrialState:
    """The legal path to RUNNING: a reopened finished trial and a stale RUNNING one (its
    process died unrecorded) pass through PENDING first."""
    if state.is_finished():
        state = transition(state, TrialState.PENDING, resume=True)  # `ablate resume`, --fresh
    elif state is TrialState.RUNNING:
        state = transition(state, TrialState.PENDING)
    return transition(state, TrialState.RUNNING)
