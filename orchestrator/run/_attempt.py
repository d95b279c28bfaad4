"""One attempt of one trial as the backend sees it, and its end.

``AttemptRun`` is a running attempt: its state (``_state``), its MLflow run and commits
(``_commits``) and its start (``_start``), plus here the ``RunContext`` calls a backend makes
(metrics, checkpoints, stop, environment) and the endings (``finish``, ``fail``);
``AttemptContext`` is the face the backend gets. The runner (``_runner``) takes the trial's
lock, builds one, runs the backend and ends it. The rules it keeps (commit on checkpoint,
replacing a run MLflow holds too far) are in the runner's module docstring. Tracking is deferred
while the attempt is young (``tracking._deferred``): the outbox is filled here and sent by the
orchestrator.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import evaluation
from orchestrator import metrics as M
from orchestrator.backends import AttemptOutcome, AttemptResult
from orchestrator.run._start import AttemptStart
from orchestrator.store import atomic_write_json, records
from orchestrator.store.reference import (
    ReferenceScores,
    read_reference,
    send_reference,
    write_reference,
)
from orchestrator.store.summary import write_summary
from orchestrator.tracking import DeferredRun, log_steps
from orchestrator.trial import TrialState, transition

log = logging.getLogger(__name__)
_OUTCOME = {AttemptOutcome.COMPLETED: "completed", AttemptOutcome.STOPPED: "stopped",
            AttemptOutcome.NUMERIC_FAILURE: "numeric_failure"}


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


class AttemptRun(AttemptStart):
    """State of one running attempt; see the module docstring for the rules it keeps."""

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
        if self.stop_on and self.stop_reason is None:
            self.rescue_stop = self.rescue_warning()
            if self.rescue_stop is not None:
                self.stop_reason = (f"stopped for a rescue: warning {self.rescue_stop[0]} at step "
                                    f"{self.rescue_stop[1]}")
        if not self.warned:
            self._record_warning()

    def _record_warning(self) -> None:
        """The trial's first warning, on record the step it fires (``warning.json``, once per
        trial): the grid's ``warning`` alert reads it while the trial runs, not at its end."""
        if self.rescue_stop is not None:
            rule, step = self.rescue_stop
            why = f"{rule} fired at step {step}; the grid's rescue policy stops the trial for it"
        elif self.engine.warning_step is not None:
            rule, step = "early_warning", self.engine.warning_step
            w = self.engine.warning.spec  # type: ignore[union-attr]
            why = (f"mismatch early warning at step {step}: {w.metric} rose above {w.ratio:g}x its "
                   f"level {w.lag} observations back (still running at step {self.last_step})")
        else:
            return
        self.warned = True
        atomic_write_json(self.paths.warning, {"rule": rule, "step": step, "reason": why,
                                               "attempt": self.number, "at": time.time()})

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
        self._score_reference(step)  # before retention may drop the checkpoint
        self.store.prune()

    def _score_reference(self, step: int) -> None:
        """For a trainer whose evals cannot run the grid's reference evaluator in-process
        (``Evaluator.at_checkpoints``: verl), score the checkpoint just saved into the
        trial's ``reference.json`` and its MLflow run, as ``ablate evaluate`` would later. A
        score that cannot be made is logged and left to ``ablate evaluate``; it never fails the
        trial's training."""
        target = evaluation.reference_of(self.job.config)
        if target not in evaluation.IN_RUN_TARGETS:
            return  # none, or a job of its own that `ablate evaluate` runs
        evaluator = self.job.backend_ref.evaluator(self.job.pool)
        if not evaluator.at_checkpoints:
            return
        t0 = time.perf_counter()
        try:
            value = evaluator.score(self.job.trial, self.job.config, self.job.pool,
                                    self.store.path(step), step, target)
        except Exception as exc:  # noqa: BLE001 - a missing score is visible; training goes on
            log.warning("trial %s: reference score of step %d not made: %s",
                        self.job.trial.trial_id, step, exc)
            return
        held = read_reference(self.paths)
        if held is None or (held.target, held.evaluator) != (target, evaluator.version):
            held = ReferenceScores(target, str(evaluator.version))
        held.scores[step] = (value, time.perf_counter() - t0)
        write_reference(self.paths, held)  # sent to MLflow at the attempt's end (_send_reference)

    def _send_reference(self) -> None:
        """The attempt's reference scores to the trial's MLflow run (one request, at its end:
        the outbox takes rows in step order only, and these are for steps it has sent); left
        for ``ablate evaluate`` when the run does not exist yet or the store is down."""
        held = read_reference(self.paths)
        target = self.job.tracking
        if held is None or target is None or self.tracker is None \
                or isinstance(self.tracker, DeferredRun):
            return  # a deferred attempt's orchestrator sends them with its outbox (send_trial)
        send_reference(self.paths, held, self.tracker.run_id, lambda run, values: log_steps(
            target.uri, run, M.EVAL_REWARD_REF, values))

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
        rescued = self._rescued(verdict) if outcome == "stopped" and self.rescue_stop else {}
        state = TrialState.CANCELLED if outcome == "cancelled" else TrialState.DONE
        self.record.state = transition(self.record.state, state)
        self.record.verdict = {**verdict.to_json(), **rescued}
        self.record.last_step = self.last_step
        # One check of the closed file now, so readers of the grid need not parse it again.
        trial_summary = write_summary(self.paths, self.last_step)
        self.record.metrics_stamp = trial_summary.stamp.to_json()
        records.save_state(self.paths, self.record)
        summary = {**self.last_values, **{k: float(v) for k, v in result.summary.items()}}
        out = {"trial_id": self.job.trial.trial_id, "state": state.value, "outcome": outcome,
               "last_step": self.last_step, "attempt": self.number, "verdict": self.record.verdict,
               "node": self.attempt.node, "summary": summary}
        if self.tracker is not None:
            self.tracker.set_tags(trial_summary.tags())
            self.tracker.set_verdict(verdict)
            if rescued:
                self.tracker.set_tags({"verdict.reason": rescued["reason"][:4000],
                                       "verdict.rescued_step": str(rescued["rescued_step"]),
                                       "verdict.rescued_by": rescued["rescued_by"]})
            self.tracker.log_attempts(self.attempts)
            self.tracker.flush(30.0)
            self._send_reference()
            self.tracker.end("KILLED" if state is TrialState.CANCELLED else "FINISHED")
        if outcome == "cancelled":
            records.clear_cancel_requests(self.grid_dir, [self.job.trial.trial_id])
        shutil.rmtree(self.paths.root / "work", ignore_errors=True)
        return out

    def _rescued(self, verdict: Any) -> dict[str, Any]:
        """What a trial stopped on a warning for a rescue adds to its verdict: the warning and
        its step (``grid.entry_for`` reads them); its kind stays what it was up to then."""
        name, step = self.rescue_stop  # type: ignore[misc]
        return {"rescued_step": step, "rescued_by": name,
                "reason": f"rescued at step {step} on warning {name}, stopped at step "
                          f"{self.last_step}; until then {verdict.reason}"}

    def fail(self, exc: BaseException, *, retriable: bool) -> None:
        """Record a failed attempt. Retriable failures go back to PENDING for Tune to retry."""
        reason = f"{type(exc).__name__}: {exc}"[:1000]
        self.record.error = reason
        self.record.last_step = self.last_step
        if retriable:
            if self.record.state is not TrialState.PENDING:  # it failed before it was marked running
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
