"""Semantic checks of the cost-related keys: ``seeds: {adaptive: ...}``, ``compare:`` (and its
tests: ``target``, ``margin``, ``paired``) and the accelerator-hour budget (``budget.gpu_hours``, ``budget.gpu_hours_per_pool``).

The schema has already checked shapes (``min <= max``, ``0 < ci_width < 1``); what needs the
axes, the collapse rules or the pool catalogue is checked here, at plan time, so a grid that
could never run its adaptive plan or afford one trial is refused before anything starts.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.cost import fmt_hours, pool_rate
from orchestrator.exceptions import did_you_mean
from orchestrator.pools import PoolCatalog
from orchestrator.schema import CompareDecl, GridFile

if TYPE_CHECKING:
    from orchestrator.grid._checker import Checker
    from orchestrator.grid._spec import Axis, GridSpec
    from orchestrator.trial import TrialSpec


def check_cost_keys(spec: GridFile, axes: Sequence[Axis], chk: Checker, catalog: PoolCatalog,
                    label: object) -> None:
    """Adaptive seeds, declared comparisons and budgets of ``spec`` (``label``: axis_label)."""
    _check_adaptive(spec, chk)
    _check_compare(spec, axes, chk, label)
    _check_budget(spec, axes, chk, catalog)


def _check_adaptive(spec: GridFile, chk: Checker) -> None:
    ad = spec.adaptive
    if ad is None:
        return
    path = ("seeds", "adaptive", "target")
    if spec.search is not None:
        raise chk.err("adaptive seeds cannot be combined with 'search:' (a search picks its own "
                      "points)", ("seeds", "adaptive"), fix="give 'seeds:' as a list")
    _check_reference_target(spec, ad.target, path, chk)
    if ad.target in COLLAPSE_TARGETS and not _judges_collapse(spec):
        raise chk.err(f"{ad.target} is not recorded by this grid (collapse.rules is 'none' and "
                      "there are no extra_rules)", path, allowed=["final_reward"], got=ad.target,
                      fix="use target: final_reward or turn the collapse rules on")


COLLAPSE_TARGETS = ("collapse_rate", "time_to_collapse")


def _check_reference_target(spec: GridFile, target: str | None, path: tuple, chk: Checker) -> None:
    """``final_reward_ref`` is recorded only by a grid with a reference evaluator."""
    if target == "final_reward_ref" and spec.eval.reference is None:
        raise chk.err("final_reward_ref is not recorded by this grid (it has no reference "
                      "evaluator)", path, allowed=["final_reward"], got=target,
                      fix="add 'eval: {reference: trainer}' or use target: final_reward")


def _judges_collapse(spec: GridFile) -> bool:
    return spec.collapse.rules != "none" or bool(spec.collapse.extra_rules)


def _check_tests(spec: GridFile, decl: CompareDecl, base: tuple, chk: Checker) -> None:
    """``target``, ``margin`` and ``paired`` of one declared comparison."""
    _check_reference_target(spec, decl.target, base + ("target",), chk)
    if decl.target in COLLAPSE_TARGETS and not _judges_collapse(spec):
        raise chk.err(f"{decl.target} is not recorded by this grid (collapse.rules is 'none' and "
                      "there are no extra_rules)", base + ("target",), allowed=["final_reward"],
                      got=decl.target, fix="compare final_reward or turn the collapse rules on")
    if decl.margin is not None:
        m = float(decl.margin)
        if decl.target is None:
            raise chk.err("a margin is on one target's scale, and this comparison names none",
                          base + ("margin",), fix="add target: final_reward (reward units), "
                          "collapse_rate (a rate) or time_to_collapse (steps)")
        lo, hi = spec.metrics.bounds("reward")
        # Every target's scale is bounded: a rate by 1, a step count by the trial's steps, the
        # reward by its declared range (a margin as wide as the range accepts any difference).
        top = {"collapse_rate": 1.0, "time_to_collapse": float(spec.steps),
               "final_reward": hi - lo, "final_reward_ref": hi - lo}.get(decl.target, math.inf)
        if not (math.isfinite(m) and 0 < m < top):
            raise chk.err(f"margin {m:g} must be above 0" + ("" if top == math.inf else
                          f" and below {top:g} (the width of {decl.target}'s range)"), base + ("margin",),
                          got=m, fix="e.g. margin: " + (f"{max(spec.steps // 20, 1)} (steps)"
                                                        if decl.target == "time_to_collapse" else "0.05"))
    if decl.paired:
        if decl.target not in (None, "final_reward", "final_reward_ref"):
            raise chk.err(f"paired applies to the final reward; {decl.target} is compared "
                          "unpaired", base + ("paired",), fix="drop paired or use target: final_reward")
        rows = [("include", r) for r in spec.include] + [("exclude", r) for r in spec.exclude]
        key = next((k for k, r in rows if "seed" in r), None)
        if key is not None:
            raise chk.err(f"pairing needs every cell to run the same seeds, and an '{key}' row "
                          "names a seed, so the seeds of some cells differ", base + ("paired",),
                          fix=f"drop paired or the seed from the {key} row")


def _check_compare(spec: GridFile, axes: Sequence[Axis], chk: Checker, label: object) -> None:
    many = isinstance(spec.compare, list)
    names = [a.name for a in axes]
    for i, decl in enumerate(spec.comparisons):
        base = ("compare", i) if many else ("compare",)
        axis = next((a for a in axes if a.name == decl.axis), None)
        if axis is None:
            raise chk.err(f"{decl.axis!r} is not an axis of this grid", base + ("axis",),
                          allowed=names, got=decl.axis)
        wanted = label(decl.baseline)  # type: ignore[operator]
        if wanted not in axis.labels:
            raise chk.err(f"baseline {wanted!r} is not a value of axis {decl.axis!r}",
                          base + ("baseline",), allowed=list(axis.labels), got=wanted)
        if len(axis.labels) < 2:
            raise chk.err(f"axis {decl.axis!r} has one value: nothing to compare", base + ("axis",))
        _check_tests(spec, decl, base, chk)
    _check_repeats(spec, chk, label, many)


def _check_repeats(spec: GridFile, chk: Checker, label: object, many: bool) -> None:
    """A comparison declared twice is made once (``stats.seeds.merged``), so two declarations
    may not give it two different margins on one target: one of them would be dropped."""
    margins: dict[tuple[str, str, str], tuple[int, float]] = {}
    for i, decl in enumerate(spec.comparisons):
        if decl.margin is None or decl.target is None:
            continue
        key = (decl.axis, label(decl.baseline), decl.target)  # type: ignore[operator]
        first = margins.setdefault(key, (i, float(decl.margin)))
        if first[1] != float(decl.margin):
            raise chk.err(f"{decl.axis} vs {key[1]} on {decl.target} already has margin "
                          f"{first[1]:g} (compare[{first[0]}]); a comparison is made once, with "
                          "one margin", ("compare", i, "margin") if many else ("compare", "margin"),
                          got=decl.margin, fix="keep one of the two margins")


def _pools_of(spec: GridFile, axes: Sequence[Axis]) -> list[str]:
    pools = [spec.pool] if spec.pool else []
    for a in axes:
        if a.kind == "pool":
            pools += list(a.labels)
    pools += [str(r["pool"]) for r in spec.include if isinstance(r.get("pool"), str)]
    return list(dict.fromkeys(pools))


def one_trial_hours(catalog: PoolCatalog, pool: str, steps: int) -> float | None:
    """Planned cost of one trial on ``pool`` from its ``step_seconds`` (None: no estimate)."""
    spec = catalog.pools.get(pool)
    if spec is None or spec.step_seconds is None:
        return None
    n, _ = pool_rate(spec)
    return steps * spec.step_seconds * n / 3600


def _check_budget(spec: GridFile, axes: Sequence[Axis], chk: Checker, catalog: PoolCatalog) -> None:
    budget = spec.budget
    for pool in budget.gpu_hours_per_pool:
        if pool not in catalog:
            hint = did_you_mean(pool, catalog.names())
            raise chk.err(f"unknown pool {pool!r}" + (f"; did you mean {hint!r}?" if hint else ""),
                          ("budget", "gpu_hours_per_pool", pool), allowed=catalog.names())
    units = {p: pool_rate(catalog.pools[p])[1] for p in _pools_of(spec, axes) if p in catalog}
    if budget.gpu_hours is not None and len(set(units.values())) > 1:
        raise chk.err(f"one budget over pools counted in different units ({', '.join(f'{p}: {u}' for p, u in units.items())}): "
                      "GPU-hours and CPU-hours do not add up", ("budget", "gpu_hours"),
                      fix="set budget.gpu_hours_per_pool, one budget per pool, instead")
    costs = {p: one_trial_hours(catalog, p, spec.steps) for p in _pools_of(spec, axes)}
    known = {p: c for p, c in costs.items() if c is not None}
    if budget.gpu_hours is not None and known and len(known) == len(costs):
        cheapest = min(known.values())
        if budget.gpu_hours < cheapest:
            pool = min(known, key=known.__getitem__)
            raise chk.err(f"{budget.gpu_hours:g} h is below the cost of one trial of the cheapest "
                          f"cell ({cheapest:.3g} h on {pool}: {spec.steps} steps x "
                          f"{catalog.pools[pool].step_seconds:g} s)", ("budget", "gpu_hours"),
                          fix=f"raise it to at least {cheapest:.3g} or shorten 'steps:'")
    for pool, hours in budget.gpu_hours_per_pool.items():
        one = costs.get(pool)
        if one is not None and hours < one:
            raise chk.err(f"{hours:g} h is below the cost of one trial on {pool} ({one:.3g} h)",
                          ("budget", "gpu_hours_per_pool", pool), fix=f"raise it to at least {one:.3g}")


def plan_lines(grid: GridSpec, trials: Sequence[TrialSpec]) -> list[str]:
    """What ``ablate plan`` says about adaptive seeds, the projected cost and the budget."""
    spec, lines = grid.spec, []
    ad = spec.adaptive
    if ad is not None:
        seeds: dict[object, int] = {}  # cell -> its seeds (`exclude:`/`include:` may leave fewer)
        for t in trials:
            if t.derived_from is None:
                seeds[t.axes] = seeds.get(t.axes, 0) + 1
        start = sum(min(ad.min, ad.max, n) for n in seeds.values())
        lines.append(f"adaptive seeds: starts with {start} trials ({ad.min} "
                     f"per cell), at most {len(trials)} ({ad.max} per cell); target {ad.target}, "
                     f"ci_width {ad.ci_width:g} at {ad.level:.0%}")
    hours: dict[str, float] = {}
    for t in trials:
        one = one_trial_hours(grid.pools, t.pool, t.steps)
        if one is None:
            hours = {}
            break
        unit = pool_rate(grid.pools.pools[t.pool])[1]
        hours[unit] = hours.get(unit, 0.0) + one
    if hours:
        lines.append("projected cost of every trial (pools' step_seconds): "
                     + ", ".join(fmt_hours(h, u) for u, h in hours.items()))
    if spec.budget.gpu_hours is not None or spec.budget.gpu_hours_per_pool:
        per = ", ".join(f"{p}={h:g}" for p, h in spec.budget.gpu_hours_per_pool.items())
        lines.append("budget: " + (f"gpu_hours={spec.budget.gpu_hours:g}" if spec.budget.gpu_hours
                                   is not None else "") + (f" per pool {per}" if per else ""))
    return lines
