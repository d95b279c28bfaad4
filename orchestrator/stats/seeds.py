"""Adaptive seeds: where the next seed changes the answer most.

A *cell* is one configuration (a grid trial's axis labels; the seed is not an axis). For the
grid's target (``collapse_rate``, ``final_reward`` (``final_reward_ref``: the reference
evaluator's) or ``time_to_collapse``) each cell has an
interval over its finished seeds (``orchestrator.stats.intervals``: Wilson score / Student t on the
logit scale for a reward in [0, 1]; ``orchestrator.stats.survival``: the restricted mean survival time
up to the grid's ``steps``, its width as a share of ``steps``), and each declared comparison
(``compare: {axis, baseline}``) a difference with its interval (Newcombe / Welch or paired t /
RMST difference) and a p-value (the interval's own test; the log-rank test for the time to
collapse), adjusted over the declared comparisons (``orchestrator.stats.hypotheses``: Holm unless the
grid says ``multiplicity:``). A comparison is decided when its adjusted p-value is below
``1 - level``; with one comparison that is exactly "its interval excludes 0".

A cell needs another seed while it has fewer than ``max`` seeds and neither its interval is at
most ``ci_width`` wide nor every comparison it takes part in is decided. Among those, cells of
an undecided comparison come first, then the widest interval. (Ranking the cell in the most
undecided comparisons first, so a shared baseline goes first, was measured too and did worse:
``benchmarks/adaptive_seeds.py``, median cost ratio 66% against 60% over its seed orders.)
Seeds are handed out in order (``0, 1, ...``), so the n-th seed of a cell is the trial a grid listing ``seeds: [0..n-1]``
would run: same content-hashed id, nothing special for ``compare``, resume or MLflow.

The functions here are pure (outcomes in, decisions out): the scheduler feeds them the trial
files (``scheduler._budget``), ``ablate compare`` its MLflow runs, the benchmark recorded runs.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from statistics import NormalDist

from orchestrator.schema import DEFAULT_RANGE, AdaptiveSeedsSpec, CompareDecl
from orchestrator.stats import hypotheses, survival
from orchestrator.stats.intervals import (
    NAN,
    Interval,
    bounded_mean,
    mean_difference,
    paired_difference,
    rate_difference,
    wilson,
)

CellKey = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished trial of a cell: its verdict as collapsed or not (None: not judged, e.g. an
    infra failure), its final reward (NaN if none), its cost in accelerator-hours and its time
    (the verdict step of a collapse, else the last observed step; None: unknown)."""

    seed: int
    collapsed: bool | None
    reward: float = math.nan
    hours: float | None = None
    step: int | None = None
    reward_ref: float = math.nan  # the reference evaluator's final reward (``eval/reward_ref``)

    @property
    def observation(self) -> survival.Observation | None:
        """The trial as survival data (``orchestrator.stats.survival``); None when not judged."""
        if self.collapsed is None or self.step is None:
            return None
        return survival.Observation(float(self.step), bool(self.collapsed))


# The targets that are a final reward: the trial's own eval, or the reference evaluator's
# (``eval: {reference: ...}``, ``orchestrator/evaluation.py``).
REWARD_TARGETS = ("final_reward", "final_reward_ref")


def reward_of(o: Outcome, target: str) -> float:
    """The final reward ``target`` reads of one trial."""
    return o.reward_ref if target == "final_reward_ref" else o.reward


def observations(outcomes: Sequence[Outcome]) -> list[survival.Observation]:
    return [ob for o in outcomes if (ob := o.observation) is not None]


def cell_text(cell: CellKey) -> str:
    """A cell as its axis labels, ``axis=value, ...`` (``(all)`` for a grid without axes)."""
    return ", ".join(f"{k}={v}" for k, v in cell) or "(all)"


def cell_interval(outcomes: Sequence[Outcome], target: str, level: float = 0.95,
                  horizon: int = 0, reward_range: tuple[float, float] = DEFAULT_RANGE) -> Interval:
    """The cell's interval for ``target`` over its finished seeds (time to collapse: the RMST up
    to ``horizon`` steps; the final reward: inside ``reward_range``)."""
    if target == "collapse_rate":
        judged = [o.collapsed for o in outcomes if o.collapsed is not None]
        return wilson(sum(judged), len(judged), level)
    if target == "time_to_collapse":
        return _rmst_for_seeds(observations(outcomes), horizon, level)
    return bounded_mean([reward_of(o, target) for o in outcomes], *reward_range, level=level)


def _rmst_for_seeds(obs: Sequence[survival.Observation], horizon: int, level: float) -> Interval:
    """The RMST interval, widened to at least the Wilson interval of its share of the horizon
    taken as a rate: a trial's collapse-free share lies in [0, 1], where a yes/no outcome has the
    largest variance for its mean. Greenwood's interval is a point when a cell has no collapse
    (or all at one step), which would stop adaptive seeds at ``min`` however few seeds ran."""
    iv = survival.rmst(obs, horizon, level)[0]
    if not obs or horizon <= 0 or not math.isfinite(iv.estimate):
        return iv
    share = wilson(round(iv.estimate / horizon * len(obs)), len(obs), level)
    return Interval(iv.estimate, min(iv.low, share.low * horizon), max(iv.high, share.high * horizon), iv.n)


def relative_width(iv: Interval, target: str, horizon: int = 0,
                   reward_range: tuple[float, float] = DEFAULT_RANGE) -> float:
    """The interval's width on a 0-1 scale (``ci_width``'s): RMST widths over the horizon,
    reward widths over the reward's range."""
    if target == "time_to_collapse":
        return iv.width / horizon if horizon > 0 else iv.width
    if target in REWARD_TARGETS:
        return iv.width / (reward_range[1] - reward_range[0])
    return iv.width


def paired_rewards(a: Sequence[Outcome], b: Sequence[Outcome],
                   target: str = "final_reward") -> list[tuple[float, float]]:
    """(reward in ``a``, reward in ``b``) for each seed both cells have."""
    rb = {o.seed: reward_of(o, target) for o in b}
    return [(reward_of(o, target), rb[o.seed]) for o in a if o.seed in rb]


def difference(a: Sequence[Outcome], b: Sequence[Outcome], target: str, level: float = 0.95,
               horizon: int = 0, paired: bool = False) -> Interval:
    """Interval of (cell ``a`` minus cell ``b``) for ``target``."""
    if target == "collapse_rate":
        ja = [o.collapsed for o in a if o.collapsed is not None]
        jb = [o.collapsed for o in b if o.collapsed is not None]
        return rate_difference(sum(ja), len(ja), sum(jb), len(jb), level)
    if target == "time_to_collapse":
        return survival.rmst_difference(observations(a), observations(b), horizon, level)
    if paired:
        return paired_difference(paired_rewards(a, b, target), level)
    return mean_difference([reward_of(o, target) for o in a], [reward_of(o, target) for o in b],
                           level)


def p_value(a: Sequence[Outcome], b: Sequence[Outcome], target: str, horizon: int = 0,
            paired: bool = False) -> float:
    """The comparison's two-sided p-value: log-rank for the time to collapse, else the test
    its interval inverts (``hypotheses.p_from_interval``)."""
    if target == "time_to_collapse":
        return survival.logrank_p(observations(a), observations(b))
    return hypotheses.p_from_interval(lambda lv: difference(a, b, target, lv, horizon, paired))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One declared comparison of one cell against its baseline cell (other axes equal):
    the difference with its interval, the p-value and the p-value adjusted over the family,
    and the equivalence verdict at the declared margin ("" when none is declared)."""

    axis: str
    value: str
    baseline: str
    cell: CellKey
    base_cell: CellKey
    diff: Interval
    p_value: float = math.nan
    p_adjusted: float = math.nan
    alpha: float = 0.05
    margin: float | None = None
    equivalence: str = ""
    paired: bool = False
    family: int = 1  # how many comparisons the p-value was adjusted over (this target's)

    @property
    def decided(self) -> bool:
        if math.isfinite(self.p_adjusted):
            return self.p_adjusted < self.alpha
        return self.diff.decided

    @property
    def context(self) -> str:
        """The other axes' labels (what the two cells share)."""
        return ", ".join(f"{k}={v}" for k, v in self.cell if k != self.axis)


def _replace(cell: CellKey, axis: str, label: str) -> CellKey:
    return tuple((k, label if k == axis else v) for k, v in cell)


def applies(decl: CompareDecl, target: str) -> bool:
    """A declaration with a ``target:`` is made on that target only."""
    return decl.target is None or decl.target == target


@dataclasses.dataclass(frozen=True)
class _Declared:
    """The declarations of one comparison on one target, merged: ``axis`` against ``baseline``
    once, whatever number of declarations name it (one for every target and one with a margin
    on a target, as docs/statistics.md shows), so the family Holm/BH adjusts over counts it once."""

    axis: str
    baseline: str
    margin: float | None
    paired: bool


def merged(decls: Sequence[CompareDecl], target: str, label: object = str) -> list[_Declared]:
    """The distinct comparisons ``decls`` make on ``target``, in declaration order: a margin
    declared for this target joins its comparison; ``paired`` holds if any declaration says so
    (a statement about the arms' seeds). Two margins for one comparison are refused at plan
    (``grid._cells``), so the first one declared is the one."""
    out: dict[tuple[str, str], _Declared] = {}
    for decl in decls:
        if not applies(decl, target):
            continue
        key = (decl.axis, label(decl.baseline))  # type: ignore[operator]
        margin = decl.margin if decl.margin is not None and decl.target == target else None
        seen = out.get(key)
        if seen is None:
            out[key] = _Declared(key[0], key[1], margin, decl.paired)
        else:
            out[key] = dataclasses.replace(seen, margin=seen.margin if seen.margin is not None
                                           else margin, paired=seen.paired or decl.paired)
    return list(out.values())


def comparisons(cells: Mapping[CellKey, Sequence[Outcome]], decls: Sequence[CompareDecl],
                target: str, level: float = 0.95, *, label: object = str, horizon: int = 0,
                multiplicity: str = "holm") -> list[Comparison]:
    """Every (cell, baseline cell) pair the declarations name on ``target``, each once (however
    many declarations repeat it: ``merged``), with its difference, p-value adjusted over them
    all (``multiplicity``; ``family`` says how many) and equivalence verdict."""
    out = []
    for decl in merged(decls, target, label):
        base_label = decl.baseline
        paired = decl.paired and target in REWARD_TARGETS
        for cell in cells:
            value = dict(cell).get(decl.axis)
            if value is None or value == base_label:
                continue
            base = _replace(cell, decl.axis, base_label)
            if base not in cells:
                continue
            a, b = cells[cell], cells[base]
            margin = decl.margin
            equiv = "" if margin is None else hypotheses.equivalence(
                lambda lv, a=a, b=b, pr=paired: difference(a, b, target, lv, horizon, pr), margin, level)
            out.append(Comparison(decl.axis, value, base_label, cell, base,
                                  difference(a, b, target, level, horizon, paired),
                                  p_value(a, b, target, horizon, paired), alpha=1 - level,
                                  margin=margin, equivalence=equiv, paired=paired))
    adjusted = hypotheses.adjust([c.p_value for c in out], multiplicity)
    return [dataclasses.replace(c, p_adjusted=p, family=len(out)) for c, p in zip(out, adjusted)]


def needs_seed(cells: Mapping[CellKey, Sequence[Outcome]], spec: AdaptiveSeedsSpec,
               comps: Sequence[Comparison], started: Mapping[CellKey, int],
               horizon: int = 0, reward_range: tuple[float, float] = DEFAULT_RANGE) -> list[CellKey]:
    """Cells that should get another seed, most useful first (``started``: seeds a cell has
    begun, finished or not; a cell with one still running, or whose comparison partner has one,
    waits for that result)."""
    involved: dict[CellKey, list[Comparison]] = {}
    for c in comps:
        involved.setdefault(c.cell, []).append(c)
        involved.setdefault(c.base_cell, []).append(c)
    def pending(cell: CellKey) -> bool:
        return started.get(cell, len(cells[cell])) > len(cells[cell])

    ranked = []
    for cell, outcomes in cells.items():
        n = started.get(cell, len(outcomes))
        if n >= spec.max or pending(cell):
            continue
        mine = involved.get(cell, [])
        if any(pending(c.base_cell if c.cell == cell else c.cell) for c in mine):
            continue  # the other side's running seed may decide it: wait for its result
        width = relative_width(cell_interval(outcomes, spec.target, spec.level, horizon, reward_range),
                               spec.target, horizon, reward_range)
        undecided = any(not c.decided for c in mine)
        settled = bool(mine) and not undecided
        if n >= spec.min and (width <= spec.ci_width or settled):
            continue
        ranked.append((0 if undecided else 1, -width, cell))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [cell for _, _, cell in ranked]


def seeds_to_decide(comp: Comparison, a: Sequence[Outcome], b: Sequence[Outcome],
                    spec: AdaptiveSeedsSpec, horizon: int = 0) -> int | None:
    """Expected further seeds (both cells together) until ``comp``'s interval excludes 0, from a
    normal approximation at the observed difference; None when the observed difference is 0 or
    deciding would take more than ``max`` seeds per cell."""
    d = comp.diff.estimate
    if not math.isfinite(d) or d == 0:
        return None
    z = NormalDist().inv_cdf(0.5 + spec.level / 2)
    if spec.target == "collapse_rate":
        # Rates shrunk towards 1/2 (one pseudo-success and failure each) so 0/n has a variance.
        def var(xs: Sequence[Outcome]) -> float:
            judged = [o.collapsed for o in xs if o.collapsed is not None]
            p = (sum(judged) + 1) / (len(judged) + 2)
            return p * (1 - p)
        v = var(a) + var(b)
    elif spec.target == "time_to_collapse":
        return _seeds_for_logrank(a, b, spec)
    else:
        ra = [x for o in a if math.isfinite(x := reward_of(o, spec.target))]
        rb = [x for o in b if math.isfinite(x := reward_of(o, spec.target))]
        if len(ra) < 2 or len(rb) < 2:
            return None
        v = statistics.variance(ra) + statistics.variance(rb)
    n = math.ceil(z * z * v / (d * d))  # per cell
    if n > spec.max:
        return None
    return max(n - len(a), 0) + max(n - len(b), 0)


def _seeds_for_logrank(a: Sequence[Outcome], b: Sequence[Outcome], spec: AdaptiveSeedsSpec) -> int | None:
    """Further seeds until the log-rank test decides, if further seeds of each cell repeat its
    observed times in turn (no normal approximation fits a rank test at 2-10 seeds)."""
    oa, ob = observations(a), observations(b)
    if not oa or not ob:
        return None
    for n in range(max(len(oa), len(ob)) + 1, spec.max + 1):
        more_a = [oa[i % len(oa)] for i in range(max(n, len(oa)))]
        more_b = [ob[i % len(ob)] for i in range(max(n, len(ob)))]
        if survival.logrank_p(more_a, more_b) < 1 - spec.level:
            return max(n - len(a), 0) + max(n - len(b), 0)
    return None


def mean_hours(outcomes: Sequence[Outcome]) -> float | None:
    hours = [o.hours for o in outcomes if o.hours is not None]
    return statistics.fmean(hours) if hours else None


__all__ = ["NAN", "REWARD_TARGETS", "CellKey", "Comparison", "Outcome", "applies", "cell_interval", "cell_text",
           "comparisons", "difference", "mean_hours", "needs_seed", "observations", "p_value",
           "paired_rewards", "relative_width", "reward_of", "seeds_to_decide"]
