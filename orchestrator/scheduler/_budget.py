"""Accelerator-hour budgets and adaptive seeds: what the gate may start, and what it adds.

``Planner`` sits beside the gate (``_gate.PoolGate``): before a queued trial starts the gate asks
``admit``; when its queue runs dry it asks ``next_seed`` for the next adaptive seed.

Budget (``budget.gpu_hours`` and ``budget.gpu_hours_per_pool``, in the pools' own units): what
the grid has spent is summed from every trial's attempts (earlier submissions included, so a
re-submit with a larger budget continues where the last one stopped) and from its probes
(``ablate probe``, a submission's ``preflight:``: the grid's ``store.probe_ledger``). A trial's projected cost
is its steps left x a step time x the pool's accelerators; the step time is, in order, the
measured one of trials of the same cell, of the same pool, then the pool's ``step_seconds``. A
trial that does not fit even if nothing else ran is *skipped for budget* (it stays pending with
the reason; a re-submit retries it); one that fits only once the running trials end waits. A
pool with neither a measurement nor an estimate runs one trial at a time until it has one.

Adaptive seeds (``seeds: {adaptive: ...}``): each cell starts with its first ``min`` seeds;
``orchestrator.stats.seeds.needs_seed`` picks the next cell after every finished trial.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import metrics as M
from orchestrator.cost import TrialCost, fmt_hours, pool_rate, total, trial_cost
from orchestrator.exceptions import StateFileError
from orchestrator.grid import axis_label
from orchestrator.pools import PoolSpec
from orchestrator.stats.seeds import (
    CellKey,
    Outcome,
    cell_interval,
    cell_text,
    comparisons,
    mean_hours,
    needs_seed,
    relative_width,
    seeds_to_decide,
)
from orchestrator.store import TrialPaths, probe_ledger, records
from orchestrator.store.reference import read_reference
from orchestrator.trial import TrialSpec, TrialState

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec


class Admit(enum.Enum):
    START = "start"
    WAIT = "wait"  # fits once running trials end, or its pool's step time is being measured
    SKIP = "skip"  # does not fit in what is left of the budget


@dataclasses.dataclass
class Seen:
    """What the planner knows about one trial from its files (refreshed while unfinished)."""

    spec: TrialSpec
    finished: bool = False
    cost: TrialCost | None = None
    outcome: Outcome | None = None


class Planner:
    """Budget checks and adaptive seeds for one submission of ``grid``."""

    REFRESH_S = 1.0  # the gate asks several times a second; files are re-read at most this often

    def __init__(self, grid: GridSpec, grid_dir: Path, trials: list[TrialSpec],
                 pools: Mapping[str, PoolSpec], *, add_seeds: bool = True) -> None:
        """``add_seeds`` False (``ablate resume``): the budget holds, no adaptive seed is added."""
        self.grid, self.grid_dir = grid, Path(grid_dir)
        self.spec = grid.spec.budget
        self.adaptive = grid.spec.adaptive if add_seeds else None
        self.pools = dict(pools)
        self.cells: dict[CellKey, list[TrialSpec]] = {}
        for t in trials:
            if t.derived_from is None:
                self.cells.setdefault(t.axes, []).append(t)
        for members in self.cells.values():
            members.sort(key=lambda t: t.seed)
        self.seen: dict[str, Seen] = {}
        self.started: set[str] = set()  # trials handed to Tune by this submission
        self.added: list[TrialSpec] = []  # adaptive seeds added by this submission
        self.skipped: dict[str, float] = {}  # trial id -> projected hours it would have cost
        self.held: dict[str, str] = {}  # trial id -> why it waits (``PoolGate.reasons``)
        self.budget_out = False
        # A ``search:`` ended by the budget: its points not started, each projected to cost
        # ``search_point_hours`` (the last point's projection).
        self.search_not_started = 0
        self.search_point_hours = 0.0
        self._read_at = 0.0
        self.probes: dict[str, dict[str, Any]] = {}  # the grid's probe ledger, read on refresh
        self._ledger_warned = False  # a damaged one is said once
        # step_s and spent between two refreshes of the files (they change only there): one
        # admission asks them once per running trial, each a scan of every trial otherwise.
        self._memo: dict[tuple[Any, ...], Any] = {}

    @property
    def active(self) -> bool:
        return (self.adaptive is not None or self.spec.gpu_hours is not None
                or bool(self.spec.gpu_hours_per_pool))

    # ------------------------------------------------------------------ the initial queue

    def initial(self, trials: list[TrialSpec]) -> list[TrialSpec]:
        """The trials a submission starts with: all of them, or with adaptive seeds the first
        ``min`` seeds of each cell plus seeds an earlier submission already began."""
        if self.adaptive is None:
            return trials
        first = {t.trial_id for members in self.cells.values() for t in members[:self.adaptive.min]}
        return [t for t in trials if t.trial_id in first or t.derived_from is not None
                or TrialPaths(self.grid_dir, t.trial_id).spec.exists()]

    # ------------------------------------------------------------------ reading the trial files

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < self.REFRESH_S:
            return
        self._read_at, self._memo = now, {}
        try:
            self.probes = probe_ledger.read(self.grid_dir)
        except StateFileError as exc:  # its probes' hours are unknown: not counted
            if not self._ledger_warned:
                print(f"warning: {exc}; the budget counts no probe hours", file=sys.stderr)
            self.probes, self._ledger_warned = {}, True
        for tid in records.trial_ids(self.grid_dir):
            seen = self.seen.get(tid)
            if seen is None:  # a spec is read once; finished trials are never read again
                spec = records.load_spec(TrialPaths(self.grid_dir, tid))
                if spec is None:
                    continue
                seen = self.seen[tid] = Seen(spec)
            if seen.finished:
                continue
            paths = TrialPaths(self.grid_dir, tid)
            if not paths.attempts.exists():
                continue  # never started: costs nothing yet
            rec = records.load_state(paths, tid)
            seen.cost = trial_cost(records.load_attempts(paths), seen.spec.steps, pools=self.pools)
            if rec.state.is_finished():
                seen.finished = True
                seen.outcome = _outcome(seen.spec, rec, paths, seen.cost)

    def spent(self, pool: str | None = None, unit: str | None = None) -> float:
        """Hours spent by the grid's trials and probes (on ``pool``; in ``unit``: GPU-hours and
        CPU-hours never add up), running attempts up to now."""
        key = ("spent", pool, unit)
        if key not in self._memo:
            self._memo[key] = self._spent(pool, unit)
        return float(self._memo[key])

    def _spent(self, pool: str | None, unit: str | None) -> float:
        return sum(s.cost.hours for s in self.seen.values() if s.cost is not None
                   and (pool is None or s.spec.pool == pool) and (unit is None or s.cost.unit == unit)
                   ) + probe_ledger.hours(self.probes, pool=pool, unit=unit)

    def _unit(self, pool: str) -> str | None:
        return pool_rate(self.pools[pool])[1] if pool in self.pools else None

    def step_s(self, trial: TrialSpec, pool: str) -> float | None:
        """Seconds per step to project ``trial`` on ``pool`` with (see the module docstring)."""
        key = ("step_s", pool, trial.axes)
        if key not in self._memo:
            self._memo[key] = self._step_s(trial, pool)
        return self._memo[key]  # type: ignore[no-any-return]

    def _step_s(self, trial: TrialSpec, pool: str) -> float | None:
        def measured(match: Any) -> float | None:
            xs = [s.cost.step_s for s in self.seen.values() if s.cost is not None
                  and s.cost.step_s is not None and s.spec.pool == pool and match(s.spec)]
            return statistics.median(xs) if xs else None

        value = measured(lambda s: s.axes == trial.axes) or measured(lambda s: True)
        if value is None and pool in self.pools:
            value = self.pools[pool].step_seconds
        return value

    def projected(self, trial: TrialSpec, pool: str) -> float | None:
        """Hours the rest of ``trial`` is expected to cost on ``pool`` (None: no step time yet)."""
        step = self.step_s(trial, pool)
        if step is None or pool not in self.pools:
            return None
        seen = self.seen.get(trial.trial_id)
        done = seen.cost.steps_run if seen is not None and seen.cost is not None else 0
        n, _ = pool_rate(self.pools[pool])
        return max(trial.steps - done, 0) * step * n / 3600

    # ------------------------------------------------------------------ the gate's questions

    def admit(self, trial: TrialSpec, pool: str, running: Iterable[tuple[str, str]]) -> Admit:
        """May ``trial`` start on ``pool`` now, with ``running`` (trial id, pool) pairs going?"""
        if self.spec.gpu_hours is None and pool not in self.spec.gpu_hours_per_pool:
            return Admit.START
        self._refresh()
        running = [(tid, p) for tid, p in running if tid != trial.trial_id]
        self.held.pop(trial.trial_id, None)
        cost = self.projected(trial, pool)
        if cost is None:  # nothing known about this pool's speed: measure it on one trial
            if any(p == pool for _, p in running):
                self.held[trial.trial_id] = f"queued: budget: measuring the step time of pool {pool}"
                return Admit.WAIT
            return Admit.START
        unit = self._unit(pool)  # the grid-wide budget counts the hours of this pool's unit
        for limit, on in ((self.spec.gpu_hours, None), (self.spec.gpu_hours_per_pool.get(pool), pool)):
            if limit is None:
                continue
            spent = self.spent(on, unit)
            if spent + cost > limit:
                self.skipped[trial.trial_id] = cost
                self.budget_out = True
                return Admit.SKIP
            committed = sum(self.projected(self.seen[tid].spec if tid in self.seen else trial, p) or 0.0
                            for tid, p in running
                            if (p == on if on is not None else self._unit(p) == unit))
            if spent + committed + cost > limit:
                self.held[trial.trial_id] = "queued: budget: fits once running trials end"
                return Admit.WAIT
        self.skipped.pop(trial.trial_id, None)
        self.started.add(trial.trial_id)
        return Admit.START

    def refuse_rescue(self, trial: TrialSpec, pool: str, start: int) -> str | None:
        """Why a rescue of ``trial`` on ``pool`` from step ``start`` would exceed the grid's
        accelerator-hour budget (its steps left at the projected step time), or None."""
        spec = self.spec
        limits = ((spec.gpu_hours, None, "budget.gpu_hours"),
                  (spec.gpu_hours_per_pool.get(pool), pool, f"budget.gpu_hours_per_pool.{pool}"))
        if all(limit is None for limit, _, _ in limits):
            return None
        self.pools.setdefault(pool, self.grid.pools.get(pool))
        self._refresh(force=True)
        step = self.step_s(trial, pool)
        if step is None:
            return None  # no step time anywhere: the gate measures it like any trial's
        n, unit = pool_rate(self.pools[pool])
        cost = max(trial.steps - start, 0) * step * n / 3600
        for limit, on, key in limits:
            spent = self.spent(on, self._unit(pool)) if limit is not None else 0.0
            if limit is not None and spent + cost > limit:
                self.budget_out = True
                return (f"budget: the rescue would cost {fmt_hours(cost, unit)} with "
                        f"{fmt_hours(spent, unit)} of {key}={limit:g} h spent; raise it and "
                        "submit again")
        return None

    def skip_reason(self, trial: TrialSpec, pool: str) -> str:
        limit = self.spec.gpu_hours_per_pool.get(pool)
        key = f"budget.gpu_hours_per_pool.{pool}" if limit is not None else "budget.gpu_hours"
        limit = limit if limit is not None else self.spec.gpu_hours
        unit = pool_rate(self.pools[pool])[1] if pool in self.pools else "hours"
        spent = self.spent(pool if key != "budget.gpu_hours" else None, self._unit(pool))
        return (f"not started: budget: projected {fmt_hours(self.skipped.get(trial.trial_id), unit)} "
                f"with {fmt_hours(spent, unit)} of {key}={limit:g} h spent; raise it and submit again")

    def search_stopped(self, points_left: int, point_hours: float) -> None:
        """The search asked for a point the budget cannot pay for; ``points_left`` of its
        ``search.budget`` points will not start in this submission."""
        self.budget_out = True
        self.search_not_started = points_left
        self.search_point_hours = point_hours

    def next_seed(self, queued: Iterable[TrialSpec]) -> TrialSpec | None:
        """The next adaptive seed to run (its spec written), or None (nothing needs one now)."""
        if self.adaptive is None or self.budget_out:
            return None
        self._refresh(force=True)
        queued_ids = {t.trial_id for t in queued}
        cells, started = self._cell_outcomes(queued_ids)
        spec = self.grid.spec
        comps = comparisons(cells, spec.comparisons, self.adaptive.target, self.adaptive.level,
                            label=axis_label, horizon=spec.steps, multiplicity=spec.multiplicity)
        for cell in needs_seed(cells, self.adaptive, comps, started, spec.steps,
                               spec.metrics.bounds("reward")):
            if started[cell] >= len(self.cells[cell]):
                continue  # `exclude:` took some of its seeds (or `include:` gave it one): at its max
            trial = self.cells[cell][started[cell]]
            records.save_spec(TrialPaths(self.grid_dir, trial.trial_id), trial)
            self.added.append(trial)
            return trial
        return None

    def waiting(self, running_ids: Iterable[str]) -> bool:
        """More adaptive seeds may follow once a running trial ends."""
        return self.adaptive is not None and not self.budget_out and any(True for _ in running_ids)

    def _cell_outcomes(self, queued: set[str]) -> tuple[dict[CellKey, list[Outcome]], dict[CellKey, int]]:
        cells: dict[CellKey, list[Outcome]] = {}
        started: dict[CellKey, int] = {}
        for cell, members in self.cells.items():
            outs, n = [], 0
            for t in members:
                seen = self.seen.get(t.trial_id)
                if seen is None and t.trial_id not in queued:
                    break  # seeds are taken in order: the first unstarted one ends the cell's run
                n += 1
                if seen is not None and seen.outcome is not None:
                    outs.append(seen.outcome)
            cells[cell], started[cell] = outs, n
        return cells, started

    # ------------------------------------------------------------------ the end of a submission

    def summary(self) -> dict[str, Any]:
        """What ran, what was skipped for budget, what finishing would cost (JSON-safe)."""
        if not self.active:
            return {}
        self._refresh(force=True)
        out: dict[str, Any] = {}
        spent: dict[str, float] = {}
        for s in self.seen.values():
            if s.cost is not None:
                spent[s.cost.unit] = spent.get(s.cost.unit, 0.0) + s.cost.hours
        probes = {e["unit"]: probe_ledger.hours(self.probes, unit=e["unit"]) for e in self.probes.values()}
        spent.update({u: spent.get(u, 0.0) + h for u, h in probes.items()})
        if self.spec.gpu_hours is not None or self.spec.gpu_hours_per_pool:
            by_trial = {tid: h for tid, h in self.skipped.items()
                        if tid not in self.seen or not self.seen[tid].finished}
            out["budget"] = {"gpu_hours": self.spec.gpu_hours,
                             "gpu_hours_per_pool": dict(self.spec.gpu_hours_per_pool),
                             "spent": spent, "probes": probes, "started": len(self.started),
                             "skipped": sorted(by_trial),
                             "search_points_not_started": self.search_not_started,
                             "to_finish_hours": sum(by_trial.values())
                             + self.search_not_started * self.search_point_hours}
        if self.adaptive is not None:
            out["adaptive"] = self._adaptive_summary()
        return out

    def _adaptive_summary(self) -> dict[str, Any]:
        ad = self.adaptive
        assert ad is not None
        cells, started = self._cell_outcomes(set())
        spec = self.grid.spec
        comps = comparisons(cells, spec.comparisons, ad.target, ad.level, label=axis_label,
                            horizon=spec.steps, multiplicity=spec.multiplicity)
        rows = []
        for cell, outs in cells.items():
            iv = cell_interval(outs, ad.target, ad.level, spec.steps, spec.metrics.bounds("reward"))
            rows.append({"cell": cell_text(cell), "seeds": len(outs), "estimate": _num(iv.estimate),
                         "low": _num(iv.low), "high": _num(iv.high),
                         "met": relative_width(iv, ad.target, spec.steps,
                                                spec.metrics.bounds("reward")) <= ad.ci_width,
                         "at_max": started[cell] >= min(ad.max, len(self.cells[cell]))})
        undecided = []
        for c in comps:
            if c.decided:
                continue
            extra = seeds_to_decide(c, cells[c.cell], cells[c.base_cell], ad, spec.steps)
            per = mean_hours(list(cells[c.cell]) + list(cells[c.base_cell]))
            undecided.append({"axis": c.axis, "value": c.value, "baseline": c.baseline,
                              "context": c.context, "diff": _num(c.diff.estimate),
                              "low": _num(c.diff.low), "high": _num(c.diff.high), "more_seeds": extra,
                              "expected_hours": None if extra is None or per is None else extra * per})
        return {"target": ad.target, "ci_width": ad.ci_width, "level": ad.level,
                "cells": rows, "added_seeds": [t.trial_id for t in self.added],
                "comparisons": len(comps), "decided": sum(c.decided for c in comps),
                "undecided": undecided}


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _outcome(spec: TrialSpec, rec: records.TrialRecord, paths: TrialPaths,
             cost: TrialCost | None) -> Outcome:
    kind = (rec.verdict or {}).get("kind")
    collapsed = None if kind in (None, "infra_failure") or rec.state is not TrialState.DONE else \
        kind in ("collapsed", "numeric_failure")
    summary = records.stored_result(paths, rec).get("summary") or {}
    reward = next((records.finite_or_none(summary.get(k)) for k in (M.EVAL_REWARD, M.TRAIN_REWARD)
                   if records.finite_or_none(summary.get(k)) is not None), None)
    # Its time to collapse (orchestrator.stats.survival): the collapse step, else the last step seen.
    vstep = (rec.verdict or {}).get("step")
    step = vstep if collapsed and isinstance(vstep, int) else rec.last_step
    ref = records.finite_or_none(summary.get(M.EVAL_REWARD_REF))
    if ref is None:  # scored at its checkpoints (verl) or after the fact: its last scored step
        held = read_reference(paths)
        ref = records.finite_or_none(held.scores[max(held.scores)][0]) \
            if held is not None and held.scores else None
    return Outcome(spec.seed, collapsed, math.nan if reward is None else reward,
                   None if cost is None else cost.hours, None if collapsed is None else step,
                   math.nan if ref is None else ref)


def end_report(summary: Mapping[str, Any]) -> list[str]:
    """The lines ``ablate submit`` prints at the end about cost, budget and adaptive seeds."""
    lines = []
    for unit, hours in (summary.get("cost") or {}).items():
        lines.append(f"cost: {fmt_hours(hours['hours'], unit)} over {hours['trials']} trials "
                     f"(lost to retries {fmt_hours(hours['retry_hours'], unit)}, saved by early stop "
                     f"{fmt_hours(hours['saved_hours'], unit)})")
    b = summary.get("budget")
    if b:
        limit = f"budget.gpu_hours={b['gpu_hours']:g} h" if b["gpu_hours"] is not None else "per-pool budgets"
        points = b.get("search_points_not_started", 0)
        lines.append(f"budget: {limit}; started {b['started']} trials this submission; "
                     f"{len(b['skipped'])} skipped for budget"
                     + (f", {points} search point(s) not started" if points else "")
                     + (f", projected {b['to_finish_hours']:.3g} h to finish them (raise the budget "
                        "and submit again)" if b["skipped"] or points else ""))
        if probes := {u: h for u, h in (b.get("probes") or {}).items() if h > 0}:
            lines.append("budget: of the hours spent, the grid's probes "
                         + ", ".join(fmt_hours(h, u) for u, h in probes.items()))
    a = summary.get("adaptive")
    if a:
        met = sum(1 for c in a["cells"] if c["met"])
        lines.append(f"adaptive seeds ({a['target']}, width {a['ci_width']:g}): {len(a['cells'])} cells, "
                     f"{met} met the width, {len(a['added_seeds'])} seeds added; comparisons "
                     f"decided {a['decided']}/{a['comparisons']}")
        for u in a["undecided"]:
            more = ("not decidable within max seeds at the observed difference" if u["more_seeds"] is None
                    else f"~{u['more_seeds']} more seeds" + (f", ~{u['expected_hours']:.3g} h"
                                                              if u["expected_hours"] is not None else ""))
            lines.append(f"  undecided: {u['axis']}={u['value']} vs {u['baseline']} ({u['context'] or 'all'}): "
                         f"{more}")
    return lines


def grid_cost(grid_dir: Path, pools: Mapping[str, PoolSpec]) -> dict[str, Any]:
    """``{"cost": per-unit totals}`` over every trial of the grid (all submissions)."""
    costs = []
    for tid, spec in records.known_trials(grid_dir).items():
        costs.append(trial_cost(records.load_attempts(TrialPaths(grid_dir, tid)), spec.steps,
                                pools=dict(pools)))
    return {"cost": total(costs)}


def cost_run_tags(summary: Mapping[str, Any]) -> dict[str, str]:
    """Budget and adaptive-seed figures of a submission as tags of its parent run."""
    tags = {}
    b = summary.get("budget")
    if b:
        if b["gpu_hours"] is not None:
            tags["budget.gpu_hours"] = f"{b['gpu_hours']:g}"
        tags["budget.skipped"] = str(len(b["skipped"]))
        tags["budget.to_finish_hours"] = f"{b['to_finish_hours']:.6g}"
    a = summary.get("adaptive")
    if a:
        tags.update({"adaptive.target": a["target"], "adaptive.added_seeds": str(len(a["added_seeds"])),
                     "adaptive.decided": f"{a['decided']}/{a['comparisons']}"})
    return tags
