"""The MLflow side of an attempt: its run opened (live, or deferred while the attempt is young:
``tracking._deferred``), a run that holds steps after the resume point replaced by a refilled
one, and the commits, on checkpoint, of the rows MLflow gets under the grid's ``tracking:
{every: N}`` (``metrics.jsonl`` keeps every step).

Apart from the start of an attempt (``_start``) and its end (``_attempt``), which call
``commit``, because what MLflow is sent never decides a result: ``verdict_steps`` reads the
verdict engine, it does not change it.
"""
from __future__ import annotations

import shutil
import time
from typing import Any

from orchestrator.run._state import AttemptState
from orchestrator.store import records
from orchestrator.tracking import DeferredRun, TrialRun, drain, outbox_run_id, supersede
from orchestrator.verdict import VerdictEngine


class AttemptCommits(AttemptState):
    """An attempt's MLflow run and its commits (the module docstring says what they keep)."""

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
            gone = outbox_run_id(outbox)
            if self.job.start == "fresh" and gone and gone not in self.record.superseded_runs:
                # The record was started anew (``_rewind``); the run of the discarded one is
                # replaced like a resume's, not left live beside the new run.
                self.record.superseded_runs = [*self.record.superseded_runs, gone]
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
            tags.update(rescue_tags(self.record, str(self.request.reason)))
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


def verdict_steps(engine: VerdictEngine) -> set[int]:
    """The steps a verdict can name, as far as ``engine`` knows now: each episode's onset and
    fire step, the start of every streak in progress (the onset of a fire still to come) and
    the early warning's onset. (Here, not in ``orchestrator.verdict``: that module decides
    results' numbers, and this decides only what MLflow is sent.)"""
    out: set[int] = set()
    for rule in engine.rules:
        for f in [*rule.episodes, *([rule.firing] if rule.firing else [])]:
            out.update((f.onset, f.fired))
        if rule.streak.start is not None:
            out.add(rule.streak.start)
    if engine.warning is not None:
        out.update(s for s in (engine.warning.step, engine.warning.streak.start) if s is not None)
    return out


def tracked_rows(rows: list[tuple[int, dict[str, float]]], every: int, named: set[int],
                 prev_keys: frozenset[str]) -> tuple[list[tuple[int, dict[str, float]]], frozenset[str]]:
    """The rows of one commit that MLflow gets under ``tracking.every``: each N-th step, the
    commit's last step, the ``named`` steps, and each row with a metric its predecessor lacks
    (an eval every 7 steps is not thinned again to every 70th); and the last row's names."""
    out = []
    for i, (step, row) in enumerate(rows):
        keys = frozenset(row)
        if step % every == 0 or i == len(rows) - 1 or step in named or not keys <= prev_keys:
            out.append((step, row))
        prev_keys = keys
    return out, prev_keys


def rescue_tags(rec: records.TrialRecord, reason: str) -> dict[str, str]:
    """A rescue's run names what it rescues (``compare`` reads these): a derived rescue its
    parent, one moved in place the event; a resume by hand has neither."""
    if rec.rescue_of:
        return {"rescue.of": str(rec.rescue_of.get("parent")), "rescue.event": str(rec.rescue_of.get("event")),
                "rescue.from_step": str(rec.rescue_of.get("step"))}
    note = rec.rescue or {}
    if note.get("trial") == rec.trial_id and reason.startswith(f"{note.get('by')} rescue "):
        return {"rescue.of": rec.trial_id, "rescue.event": str(note.get("event", "collapsed")),
                "rescue.from_step": str(note.get("start"))}
    return {}
