"""What ``ablate submit`` says off a terminal: one event per trial change and a periodic count
per pool, as text lines or JSON lines (``--json-events``), for logs, CI and scripts.

The events come from the trial files, like the live table (``_progress``): the runners write
them in Ray workers, and ``EventWatcher.poll`` (called from the live view's once-a-second tick)
compares each trial's ``state.json`` with what it saw last. A change between two polls is still
reported in order: a trial that started and finished within one second gets both events.

Event kinds and their fields are part of the command line's contract (the README lists them):
every JSON event has ``event``, ``time`` (Unix seconds) and ``grid``; trial events add
``trial_id``, ``pool``, ``label``, ``axes``, ``seed``, ``step``, ``steps`` and ``attempt``, and
``verdict``, ``reason``, ``reward`` where they apply (``null`` otherwise).
"""
from __future__ import annotations

import dataclasses
import enum
import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from orchestrator import metrics as names
from orchestrator.store import TrialPaths, records
from orchestrator.trial import TrialSpec, TrialState

SUMMARY_EVERY_S = 30.0  # default period of the per-pool summary lines
COLLAPSE_KINDS = ("collapsed", "numeric_failure")


class EventKind(enum.Enum):
    STARTED = "started"  # an attempt began (the first of this submission, or a resume)
    CHECKPOINT = "checkpoint"  # a checkpoint was committed (the newest one since the last poll)
    RETRIED = "retried"  # an attempt began after an infra failure of the one before
    FINISHED = "finished"  # done, with a verdict
    FAILED = "failed"  # retries exhausted or a failure that is not retried
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class TrialEvent:
    kind: EventKind
    time: float
    grid: str
    trial_id: str
    pool: str
    axes: Mapping[str, str]  # the trial's axis values, pool excluded
    seed: int
    step: int
    steps: int
    attempt: int
    verdict: str | None = None
    reason: str | None = None
    reward: float | None = None

    @property
    def label(self) -> str:
        """The trial's place in the grid, as ``axis=value`` pairs and its seed."""
        return " ".join([f"{k}={v}" for k, v in self.axes.items()] + [f"seed={self.seed}"])

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind.value, "time": round(self.time, 3), "grid": self.grid,
                "trial_id": self.trial_id, "pool": self.pool, "label": self.label,
                "axes": dict(self.axes), "seed": self.seed, "step": self.step, "steps": self.steps,
                "attempt": self.attempt, "verdict": self.verdict, "reason": self.reason,
                "reward": self.reward}

    def line(self) -> str:
        text = (f"{_clock(self.time)} {self.kind.value:<10} {self.trial_id} {self.pool} "
                f"[{self.label}] step {self.step}/{self.steps}")
        if self.kind in (EventKind.STARTED, EventKind.RETRIED):
            text += f" attempt {self.attempt}"
        if self.verdict:
            text += f" verdict={self.verdict}"
        if self.reward is not None:
            text += f" reward={self.reward:.3f}"
        if self.reason:
            text += f": {_one_line(self.reason)}"
        return text


@dataclasses.dataclass(frozen=True)
class PoolCounts:
    """How the trials of one pool stand, for the periodic summary."""

    time: float
    grid: str
    pool: str
    running: int
    queued: int
    done: int
    failed: int
    cancelled: int
    verdicts: Mapping[str, int]

    @property
    def collapsed(self) -> int:
        return sum(self.verdicts.get(k, 0) for k in COLLAPSE_KINDS)

    def to_json(self) -> dict[str, Any]:
        return {"event": "pool", "time": round(self.time, 3), "grid": self.grid, "pool": self.pool,
                "running": self.running, "queued": self.queued, "done": self.done,
                "failed": self.failed, "cancelled": self.cancelled, "collapsed": self.collapsed,
                "verdicts": dict(self.verdicts)}

    def line(self) -> str:
        verdicts = ", ".join(f"{k} {n}" for k, n in sorted(self.verdicts.items()))
        return (f"{_clock(self.time)} pool {self.pool}: running {self.running}, queued "
                f"{self.queued}, done {self.done}" + (f" ({verdicts})" if verdicts else "")
                + f", collapsed {self.collapsed}, failed {self.failed}"
                + (f", cancelled {self.cancelled}" if self.cancelled else ""))


Event = TrialEvent | PoolCounts
Sink = Callable[[Event], None]


@dataclasses.dataclass
class _Seen:
    state: TrialState
    attempts: int
    committed: int
    pool: str
    verdict: dict[str, Any] | None


class EventWatcher:
    """Turns changes of a grid's trial files into events for ``sink``; a pool summary every
    ``summary_every_s`` seconds. The first poll only records where the trials stand."""

    def __init__(self, grid_dir: Path, grid_name: str, sink: Sink, *,
                 summary_every_s: float = SUMMARY_EVERY_S) -> None:
        self.grid_dir, self.grid_name, self.sink = Path(grid_dir), grid_name, sink
        self.summary_every_s = summary_every_s
        self.specs: dict[str, TrialSpec] = {}
        self.seen: dict[str, _Seen] = {}
        self._stats: dict[str, tuple[int, int, int]] = {}  # state.json as last read, per trial
        self._next_summary = time.monotonic() + summary_every_s
        self._last_summary: list[PoolCounts] = []
        self._primed = False  # after the first poll, a new trial (a search point, a derived
        # trial) starts from nothing: all it did before its first poll is reported

    def poll(self) -> None:
        """Read every trial's state once; emit what changed since the last poll."""
        for tid in records.trial_ids(self.grid_dir):
            spec = self.specs.get(tid) or records.load_spec(TrialPaths(self.grid_dir, tid))
            if spec is None:
                continue
            self.specs[tid] = spec
            self._trial(spec)
        self._primed = True
        if time.monotonic() >= self._next_summary:
            self.summary()

    def summary(self, *, unless_unchanged: bool = False) -> None:
        """One ``PoolCounts`` per pool now (and the next one a period later); with
        ``unless_unchanged``, nothing if the last summary said the same (the final one)."""
        self._next_summary = time.monotonic() + self.summary_every_s
        counts = self.pool_counts()
        same = [dataclasses.replace(c, time=0.0) for c in counts]
        if unless_unchanged and same == self._last_summary:
            return
        self._last_summary = same
        for c in counts:
            self.sink(c)

    def pool_counts(self) -> list[PoolCounts]:
        now = time.time()
        by_pool: dict[str, dict[str, Any]] = {}
        for seen in self.seen.values():
            c = by_pool.setdefault(seen.pool, {"running": 0, "queued": 0, "done": 0, "failed": 0,
                                               "cancelled": 0, "verdicts": {}})
            key = "queued" if seen.state is TrialState.PENDING else seen.state.value
            c[key] += 1
            if seen.state is TrialState.DONE and seen.verdict:
                kind = str(seen.verdict.get("kind"))
                c["verdicts"][kind] = c["verdicts"].get(kind, 0) + 1
        return [PoolCounts(now, self.grid_name, pool, **c) for pool, c in sorted(by_pool.items())]

    def _trial(self, spec: TrialSpec) -> None:
        paths = TrialPaths(self.grid_dir, spec.trial_id)
        try:  # the same file as at the last poll (atomic writes make a new one): nothing changed
            st = paths.state.stat()
            stat = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stat = None
        if stat is not None and spec.trial_id in self.seen and self._stats.get(spec.trial_id) == stat:
            return
        try:
            rec = records.load_state(paths, spec.trial_id)
        except Exception:  # noqa: BLE001 - a corrupt file is the runner's to report, not a reason
            return  # to stop the submission from its progress callback
        if stat is not None:
            self._stats[spec.trial_id] = stat
        now = _Seen(rec.state, rec.attempts, rec.committed_step, rec.pool or spec.pool, rec.verdict)
        before = self.seen.get(spec.trial_id)
        self.seen[spec.trial_id] = now
        if before is None and self._primed:
            before = _Seen(TrialState.PENDING, 0, 0, now.pool, None)
        if before is None:
            return
        if now.attempts > before.attempts:
            self._attempts(spec, paths, before.attempts, now.attempts)
        # The commit of the last step is the trial's end, which FINISHED reports: a poll that
        # lands between that commit and the state's DONE must not print it as a checkpoint.
        if (now.committed > before.committed and now.state is TrialState.RUNNING
                and now.attempts == before.attempts and now.committed < spec.steps):
            self._emit(spec, now, EventKind.CHECKPOINT, now.committed, now.attempts)
        if now.state is not before.state or now.attempts > before.attempts:
            self._ended(spec, paths, rec, now)

    def _attempts(self, spec: TrialSpec, paths: TrialPaths, old: int, new: int) -> None:
        """STARTED or RETRIED for each attempt that began since the last poll."""
        try:
            attempts = records.load_attempts(paths)
        except Exception:  # noqa: BLE001 - as in ``_trial``; the start is still reported
            attempts = []
        pool = self.seen[spec.trial_id].pool
        for number in range(old + 1, new + 1):
            this = attempts[number - 1] if len(attempts) >= number else None
            if this is not None and this.outcome == "inherited":
                continue  # a derived trial's record of its parent's steps: nothing began
            prev = attempts[number - 2] if number >= 2 and len(attempts) >= number - 1 else None
            retry = prev is not None and prev.outcome in ("infra_failure", "error")
            step = (this.start_step - 1) if this is not None else 0
            kind = EventKind.RETRIED if retry else EventKind.STARTED
            reason = prev.reason if retry and prev is not None else None
            self.sink(self._event(spec, kind, pool if this is None else this.pool, max(step, 0),
                                  number, reason=reason))

    def _ended(self, spec: TrialSpec, paths: TrialPaths, rec: records.TrialRecord,
               now: _Seen) -> None:
        verdict = rec.verdict or {}
        if now.state is TrialState.DONE:
            last = records.last_metrics(paths.metrics)
            reward = None
            if last is not None:
                reward = next((records.finite_or_none(last[1][k]) for k in
                               (names.EVAL_REWARD, names.TRAIN_REWARD) if k in last[1]), None)
            self._emit(spec, now, EventKind.FINISHED, rec.last_step, now.attempts,
                       verdict=verdict.get("kind"), reason=verdict.get("reason"), reward=reward)
        elif now.state is TrialState.FAILED:
            self._emit(spec, now, EventKind.FAILED, rec.last_step, now.attempts,
                       verdict=verdict.get("kind"), reason=rec.error or verdict.get("reason"))
        elif now.state is TrialState.CANCELLED:
            self._emit(spec, now, EventKind.CANCELLED, rec.last_step, now.attempts,
                       reason=verdict.get("reason"))

    def _emit(self, spec: TrialSpec, now: _Seen, kind: EventKind, step: int, attempt: int,
              **extra: Any) -> None:
        self.sink(self._event(spec, kind, now.pool, step, attempt, **extra))

    def _event(self, spec: TrialSpec, kind: EventKind, pool: str, step: int, attempt: int,
               **extra: Any) -> TrialEvent:
        axes = {k: v for k, v in spec.axis_values.items() if k != "pool"}
        return TrialEvent(kind, time.time(), self.grid_name, spec.trial_id, pool, axes, spec.seed,
                          step, spec.steps, attempt, **extra)


# --------------------------------------------------------------------------- printers


class EventPrinter:
    """A sink that prints events: ``lines`` (text), ``json`` (one object a line) or ``quiet``
    (failed trials only, on ``errors``). Every line is flushed at once (a log follows it live)."""

    MODES = ("lines", "json", "quiet")

    def __init__(self, mode: str, out: TextIO | None = None, errors: TextIO | None = None) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode {mode!r} must be one of {self.MODES}")
        self.mode = mode
        self.out = out if out is not None else sys.stdout
        self.errors = errors if errors is not None else sys.stderr

    def __call__(self, event: Event) -> None:
        if self.mode == "json":
            self._write(self.out, json.dumps(event.to_json(), default=str))
        elif self.mode == "lines":
            self._write(self.out, event.line())
        elif isinstance(event, TrialEvent) and event.kind is EventKind.FAILED:
            self._write(self.errors, event.line())

    def summary(self, summary: Mapping[str, Any]) -> None:
        """The submission's final summary: one JSON object, or a few lines of text."""
        if self.mode == "json":
            self._write(self.out, json.dumps({"event": "summary", "time": round(time.time(), 3),
                                              **summary}, default=str))
            return
        for line in summary_lines(summary):
            self._write(self.out, line)

    @staticmethod
    def _write(stream: TextIO, text: str) -> None:
        stream.write(text + "\n")
        stream.flush()


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """A submission's summary (``submit``'s return value) as a few plain lines."""
    states = summary.get("states", {})
    verdicts = summary.get("verdicts", {})
    rescues = summary.get("rescue_trials")
    head = (f"{summary.get('grid')}: {summary.get('trials', 0)} trials"
            + (f" ({rescues} of them rescues)" if rescues else "") + " in "
            f"{summary.get('elapsed_s', 0):.0f} s: "
            + ", ".join(f"{k} {n}" for k, n in sorted(states.items())))
    if verdicts:
        head += "; verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(verdicts.items()))
    if summary.get("skipped_finished"):
        head += f"; {summary['skipped_finished']} finished before (not run again)"
    lines = [head]
    lines += [f"failed {f['trial_id']}: {_one_line(str(f.get('reason')))}"
              for f in summary.get("failed", [])]
    lines += [_unfinished(p) for p in summary.get("pending", [])]
    best = (summary.get("search") or {}).get("best")
    if best:
        lines.append(f"search best: {best.get('trial_id')} objective {best.get('objective')}")
    return lines


def _unfinished(p: Mapping[str, Any]) -> str:
    """A trial the submission did not finish: not started, or stopped at its last step."""
    step, reason = p.get("last_step") or 0, p.get("reason")
    head = (f"unfinished {p['trial_id']} ({p.get('pool')}) at step {step}" if step
            else f"not run {p['trial_id']} ({p.get('pool')})")
    return head + (f": {_one_line(str(reason))}" if reason else "")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
