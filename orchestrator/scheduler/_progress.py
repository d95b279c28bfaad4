"""What a grid is doing right now, read from its files: the live table of ``ablate submit`` and
the body of ``ablate status`` (the same view, so they never disagree), and the summary a
submission returns when it ends.

Sources: ``trials/*/spec.json``, ``state.json``, ``attempts.json``, the tail of ``metrics.jsonl``,
``queue.json`` (why queued trials wait, written by the scheduler) and ``lease.json``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import metrics as names
from orchestrator.cost import TrialCost, fmt_hours, trial_cost
from orchestrator.exceptions import StateFileError
from orchestrator.scheduler._costview import cell_label, cost_json, cost_parts
from orchestrator.scheduler._events import EventWatcher, summary_lines
from orchestrator.store import TrialPaths, active_holder, atomic_write_json, read_json, records
from orchestrator.store.summary import stamped_check
from orchestrator.trial import TrialSpec, TrialState

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

log = logging.getLogger(__name__)

REWARD_KEYS = (names.EVAL_REWARD, names.TRAIN_REWARD)
LIVE_VIEWS: dict[int, Any] = {}  # live views of running submissions, by key (see LiveView)


@dataclasses.dataclass
class TrialView:
    trial_id: str
    pool: str
    steps: int
    state: str
    step: int = 0
    reward: float | None = None
    k3_kl: float | None = None
    attempts: int = 0
    verdict: str | None = None
    note: str = ""  # pending reason, verdict reason or error
    rate: float | None = None  # steps per second of the running attempt
    cost: TrialCost | None = None  # accelerator-hours so far (orchestrator.cost)
    cell: str = ""  # the trial's axis labels (its cell: what seeds are aggregated over)
    problem: str = ""  # what is wrong with its metrics file (``ablate status`` checks)
    # Its spec.json or state.json cannot be read as this trial's (corrupt, or another trial's):
    # the one-line error with its fix; the trial is shown as "unreadable" and nothing else.
    unreadable: str = ""
    rescue: str = ""  # its rescues and refusals (the grid's ``rescue:`` policy), or what it rescues

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cost": self.cost.to_json() if self.cost else None}


@dataclasses.dataclass
class GridView:
    grid: str
    grid_dir: str
    trials: list[TrialView]
    holder: dict[str, Any] | None
    eta_s: float | None

    def pools(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.trials:
            counts = out.setdefault(t.pool, {"running": 0, "pending": 0, "done": 0, "failed": 0,
                                             "cancelled": 0})
            counts[t.state] = counts.get(t.state, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"grid": self.grid, "grid_dir": self.grid_dir, "orchestrator": self.holder,
                "eta_s": self.eta_s, "pools": self.pools(), **cost_json(self.trials),
                "trials": [t.to_json() for t in self.trials]}


def _rate(attempts: list[Any], step: int) -> float | None:
    if not attempts or attempts[-1].outcome is not None or not attempts[-1].started_at:
        return None
    a = attempts[-1]
    done = step - a.start_step + 1
    elapsed = time.time() - a.started_at
    return done / elapsed if done > 0 and elapsed > 0 else None


class ViewCache:
    """What ``collect`` need not read again on the next tick of a live view: every trial's spec
    (written once) and the view of each finished trial while its ``state.json`` is the same
    file (a resume rewrites it before anything else of the trial changes)."""

    def __init__(self) -> None:
        self.specs: dict[str, TrialSpec] = {}
        self.views: dict[str, tuple[tuple[int, int, int], TrialView]] = {}


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _specs(grid_dir: Path, cache: ViewCache | None
           ) -> tuple[list[tuple[TrialSpec, TrialPaths]], list[TrialView]]:
    """The trials' specs with their paths, and a view of each trial whose spec cannot be read
    as its own."""
    out, bad = [], []
    for tid in records.trial_ids(grid_dir):
        paths = TrialPaths(grid_dir, tid)
        try:
            spec = (cache.specs.get(tid) if cache is not None else None) or records.load_spec(paths)
        except StateFileError as exc:
            bad.append(_unreadable(tid, exc))
            continue
        if spec is not None:
            if cache is not None:
                cache.specs[tid] = spec
            out.append((spec, paths))
    return out, bad


def _unreadable(trial_id: str, exc: StateFileError, spec: TrialSpec | None = None) -> TrialView:
    return TrialView(trial_id=trial_id, pool=spec.pool if spec else "?",
                     steps=spec.steps if spec else 0, state="unreadable",
                     cell=cell_label(spec) if spec else "", note="records unreadable (see below)",
                     unreadable=str(exc))


def collect(grid_dir: Path, grid_name: str | None = None, *, check: bool = False,
            cache: ViewCache | None = None) -> GridView:
    """Read the grid's trial files into a view (a trial without state.json is pending). With
    ``check`` (``ablate status``), a damaged ``metrics.jsonl`` of a finished trial is its
    ``problem`` (``ablate submit`` repairs it); every trial's ``attempts.json`` is read whole
    either way. A trial whose spec, state or attempts cannot be read as its own is shown as
    ``unreadable`` with the error (the other trials are read as usual). With a ``cache`` (a live view, ticking once a second), a
    finished trial whose ``state.json`` did not change is not read again."""
    grid_dir = Path(grid_dir)
    queue = _queue(grid_dir)
    specs, trials = _specs(grid_dir, cache)
    for spec, paths in specs:
        key = _stat_key(paths.state) if cache is not None and not check else None
        hit = cache.views.get(spec.trial_id) if cache is not None and key is not None else None
        if hit is not None and hit[0] == key:
            trials.append(hit[1])
            continue
        try:  # one trial's damaged records are that trial's problem, not the grid's
            rec = records.load_state(paths, spec.trial_id)
            attempts = records.load_attempts(paths)  # once per trial (a corrupt file raises)
        except StateFileError as exc:
            trials.append(_unreadable(spec.trial_id, exc, spec))
            continue
        view = TrialView(trial_id=spec.trial_id, pool=rec.pool or spec.pool, steps=spec.steps,
                         state=rec.state.value, attempts=rec.attempts, cell=cell_label(spec),
                         cost=trial_cost(attempts, spec.steps))
        last = records.last_metrics(paths.metrics)
        if last is not None:
            view.step = last[0]
            view.reward = next((records.finite_or_none(last[1][k]) for k in REWARD_KEYS
                                if k in last[1]), None)
            view.k3_kl = records.finite_or_none(last[1].get(names.K3_KL))
        if rec.verdict:
            view.verdict = rec.verdict.get("kind")
            view.note = rec.verdict.get("reason", "")
        view.rescue = rescue_text(rec)
        if rec.state.value == "pending":
            view.note = rec.pending_reason or queue.get(spec.trial_id) or rec.error or "queued"
        elif rec.state.value == "failed":
            view.note = rec.error or view.note
        elif rec.state.value == "running":
            view.rate = _rate(attempts, view.step)
        if check and rec.state.is_finished():  # an unfinished one may be mid-rewind right now
            # The stamp the runner wrote at the trial's end while the file is unchanged; a full
            # parse only for a file changed since (or a trial recorded before stamps).
            view.problem = stamped_check(paths, rec).describe()
            if view.problem:
                view.note = "metrics.jsonl damaged (see below)"
        if key is not None and cache is not None and rec.state.is_finished():
            cache.views[spec.trial_id] = (key, view)
        trials.append(view)
    name = grid_name or grid_dir.name
    return GridView(name, str(grid_dir), trials, active_holder(grid_dir), _eta(trials))


def _queue(grid_dir: Path) -> dict[str, str]:
    try:
        return dict(read_json(grid_dir / "queue.json").get("reasons", {}))
    except (FileNotFoundError, ValueError):
        return {}


def _eta(trials: list[TrialView]) -> float | None:
    """Remaining steps of unfinished trials over the summed step rate of the running ones."""
    rate = sum(t.rate for t in trials if t.rate)
    remaining = sum(max(t.steps - t.step, 0) for t in trials if t.state in ("running", "pending"))
    if remaining == 0:
        return 0.0
    return remaining / rate if rate > 0 else None


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def rescue_text(rec: records.TrialRecord) -> str:
    """One line on a trial's rescues: by which entry, on what, into which trial; refusals."""
    if not (rec.rescue_of or rec.rescues or rec.rescue is not None):
        return ""  # most trials: the grid package (its schema library) is not imported for them
    from orchestrator.grid import notes

    parts = []
    if rec.rescue_of:
        parts.append(f"rescue of {rec.rescue_of.get('parent')} ({rec.rescue_of.get('event')})")
    for n in notes(rec):
        event = f"{n.get('event', 'collapsed')}{'' if n.get('step') is None else ' @' + str(n['step'])}"
        if n.get("error"):
            parts.append(f"{n.get('by')} on {event} refused: {n['error']}")
        else:
            into = "" if n.get("trial") == rec.trial_id else f" as {n.get('trial')}"
            parts.append(f"rescued by {n.get('by')} on {event}{into} on {n.get('pool')} "
                         f"from step {n.get('start')}")
    return "; ".join(parts)


def render(view: GridView, *, max_rows: int = 40) -> Any:
    """A rich renderable: per-pool counts, then the trials (running first)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    pools = Table(title=f"{view.grid}: {len(view.trials)} trials, ETA {_fmt_eta(view.eta_s)}")
    for col in ("pool", "running", "pending", "done", "failed", "cancelled"):
        pools.add_column(col, justify="left" if col == "pool" else "right")
    for pool, c in sorted(view.pools().items()):
        pools.add_row(pool, *(str(c.get(k, 0)) for k in ("running", "pending", "done", "failed",
                                                          "cancelled")))
    order = {"unreadable": -1, "running": 0, "pending": 1, "failed": 2, "done": 3, "cancelled": 4}
    rows = sorted(view.trials, key=lambda t: (order.get(t.state, 9), t.pool, t.trial_id))
    table = Table()
    for col in ("trial", "pool", "state", "step", "reward", "k3 KL", "att", "cost", "verdict / note"):
        if col == "verdict / note":
            table.add_column(col, overflow="fold", ratio=1, min_width=28)
        else:
            table.add_column(col, no_wrap=True)
    for t in rows[:max_rows]:
        table.add_row(t.trial_id, t.pool, t.state, f"{t.step}/{t.steps}", _fmt(t.reward, ".3f"),
                      _fmt(t.k3_kl, ".2e"), str(t.attempts),
                      fmt_hours(t.cost.hours, t.cost.unit) if t.cost else "",
                      escape("; ".join(filter(None, (t.rescue, t.note[:100] or t.verdict or "")))))
    parts: list[Any] = [pools, table, *cost_parts(view.trials)]
    if len(rows) > max_rows:
        parts.append(f"... {len(rows) - max_rows} more trials (ablate status --json lists all)")
    if view.holder:
        parts.append(f"orchestrator: pid {view.holder.get('pid')} on {view.holder.get('host')} "
                     f"(submission {view.holder.get('submission')})")
    return Group(*parts)


# --------------------------------------------------------------------------- a submission's summary


def trials_of(grid_dir: Path, search: bool, trials: list[TrialSpec]) -> list[str]:
    """The trials a submission reports on: its own, or every search trial of the grid."""
    if not search:
        return [t.trial_id for t in trials]
    return [tid for tid in records.trial_ids(grid_dir)
            if records.load_state(TrialPaths(grid_dir, tid), tid).search]


def summarize(grid: GridSpec, grid_dir: Path, trial_ids: list[str]) -> dict[str, Any]:
    """Counts by state and verdict, the pending trials with reasons, the search's best point."""
    states: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    pending, failed, best = [], [], None
    for tid in trial_ids:
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        states[rec.state.value] = states.get(rec.state.value, 0) + 1
        if rec.verdict:
            verdicts[rec.verdict["kind"]] = verdicts.get(rec.verdict["kind"], 0) + 1
        if not rec.state.is_finished():
            tail = records.last_metrics(TrialPaths(grid_dir, tid).metrics)  # a running trial's step
            pending.append({"trial_id": tid, "pool": rec.pool,
                            "last_step": max(rec.last_step, tail[0] if tail else 0),
                            "reason": rec.pending_reason or rec.error})
        if rec.state is TrialState.FAILED:
            failed.append({"trial_id": tid, "reason": rec.error})
        if rec.search is not None and rec.objective is not None and math.isfinite(rec.objective):
            mode = grid.spec.search.objective.mode
            if best is None or (rec.objective > best["objective"]) == (mode == "max"):
                best = {"trial_id": tid, "objective": rec.objective, **rec.search}
    out = {"grid": grid.name, "trials": len(trial_ids), "states": states, "verdicts": verdicts,
           "pending": pending, "failed": failed, "grid_dir": str(grid_dir)}
    if grid.spec.search is not None:
        out["search"] = {"budget": grid.spec.search.budget, "best": best}
    return out


# --------------------------------------------------------------------------- live view of a submission


def _tune_callback(key: int) -> Any:
    """A Tune callback that drives the live view ``key``. Tune pickles its callbacks with the
    experiment, so it holds only the key, never the view (rich's Live and the sender have locks)."""
    from ray.tune import Callback

    class LiveCallback(Callback):
        def __init__(self, key: int) -> None:
            self.key = key

        def _view(self) -> Any:
            import sys  # the registry by module name: a global here would pickle the views

            return sys.modules[__name__].LIVE_VIEWS.get(self.key)

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
            view = self._view()
            error = view.abort() if view is not None and view.abort is not None else None
            if error is not None:
                raise error  # e.g. the MLflow store turned out unreachable

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            view = self._view()
            if view is not None:
                view.tick()

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            view = self._view()
            if view is not None and view.on_trial_over is not None:
                view.on_trial_over(trial.config.get("trial_id"))

        on_trial_error = on_trial_complete

    return LiveCallback(key)


class LiveView:
    """Refreshes ``queue.json``, the rich live table and the trial events about once a second
    (from Tune's loop), and tells the submission when a trial's attempts are over (``on_trial_over``)."""

    def __init__(self, grid_dir: Path, grid_name: str, gate: Any, show: bool, *,
                 on_trial_over: Callable[[str], None] | None = None,
                 abort: Callable[[], BaseException | None] | None = None,
                 events: EventWatcher | None = None) -> None:
        self.grid_dir, self.grid_name, self.gate = grid_dir, grid_name, gate
        self.events = events  # trial events off a terminal (``_events``), polled on each tick
        if events is not None:
            events.poll()  # where the trials stand before the fit: only changes are events
        self.on_trial_over = on_trial_over
        self.abort = abort  # returns an error that should stop the submission, or None
        self._last = 0.0
        self.cache = ViewCache()  # each tick reads only the trials that changed
        self.live: Any = None
        LIVE_VIEWS[id(self)] = self
        self.callback = _tune_callback(id(self))
        if show:
            from rich.live import Live

            self.live = Live(render(collect(grid_dir, grid_name)), refresh_per_second=2, transient=False)
            self.live.start()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        atomic_write_json(self.grid_dir / "queue.json", {"reasons": self.gate.reasons(),
                                                         "updated_at": time.time()})
        if self.events is not None:
            self.events.poll()
        if self.live is not None:
            self.live.update(render(collect(self.grid_dir, self.grid_name, cache=self.cache)))

    def stop(self) -> None:
        self.tick(force=True)
        LIVE_VIEWS.pop(id(self), None)
        if self.live is not None:
            self.live.stop()


def say_interrupted(grid: GridSpec, grid_dir: Path,
                    reported: Callable[[], tuple[list[str], list[str]]], started: float,
                    already: int) -> None:
    """Ctrl-C during a submission: what its trials (and their rescues, ``reported``) got to,
    on stderr."""
    try:
        trials, rescues = reported()
        summary = summarize(grid, grid_dir, trials + rescues)
    except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must hear of
        log.warning("trial records not read: %s", exc)
        return
    summary.update(elapsed_s=time.time() - started, skipped_finished=already)
    print("interrupted; the trials so far (an unfinished one resumes from its latest "
          "checkpoint at the next `ablate submit`):", *(f"  {line}" for line in summary_lines(summary)),
          sep="\n", file=sys.stderr, flush=True)
