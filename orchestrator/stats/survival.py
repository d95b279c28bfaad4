"""Time to collapse as survival data: Kaplan-Meier, median, RMST, log-rank.

A trial is one observation ``(time, event)``: a collapse (or numeric failure) is an *event* at its
verdict step; a trial that ended without one (healthy, unstable, or stopped on the mismatch early
warning alone) is *censored* at its last observed step: it survived at least that long. An infra
failure says nothing about the training and is left out (the caller counts it).

An early-stopped collapse is an event, not a censoring: early stop ends a trial only once a
collapse rule has held for ``margin`` observations, and its verdict is ``collapsed`` at the
rule's onset step (``orchestrator.verdict``), the same step a trial run to the end would report.
Censoring it at its stop step would treat the certain collapse as "survived so far" and bias the
curve upward. A trial stopped on the early *warning* alone never showed a collapse: it is censored
at its stop step, and since it was stopped because a collapse looked likely, that censoring is
informative (the curve is then optimistic); ``compare`` counts these trials.

Estimators (the standard ones; the tests check them against lifelines 0.30.3 and a hand example):

- Kaplan-Meier survival with Greenwood's variance and the log(-log) ("exponential Greenwood")
  pointwise interval: ``scipy.stats.ecdf`` on ``scipy.stats.CensoredData`` and its
  ``confidence_interval(method="log-log")``, the interval lifelines and R's ``survival`` default
  to (scipy's own default, ``"linear"``, is the plain Greenwood interval clipped to [0, 1]; it is
  not used); where every trial still at risk collapsed (S = 0) scipy leaves the band undefined
  and it is the point 0 here;
- the median time to collapse, and its interval where the interval's bands cross 0.5
  (Brookmeyer-Crowley, as lifelines' ``median_survival_times`` of the bands); ``inf`` when the
  curve (or a band) never reaches 0.5 (fewer than half the trials collapsed);
- the restricted mean survival time up to ``horizon`` (the grid's ``steps``): the integral of
  that Kaplan-Meier curve, "collapse-free steps out of ``horizon``", with the Greenwood-type
  variance ``sum_j A_j^2 d_j / (n_j (n_j - d_j))`` (``A_j``: the area from event time ``j`` to
  the horizon) and a normal interval clipped to ``[0, horizon]`` (scipy has no RMST);
- the log-rank test of two cells (``scipy.stats.logrank``).

lifelines is not a dependency: 0.30.3 pins ``pandas<3`` and this project runs pandas 3.

Small n: Greenwood's variance is 0 when every trial of a cell collapses at the same step or none
collapses, so an RMST interval at 2-3 seeds is too narrow; comparisons are therefore *decided* by
the log-rank test (which at 2 vs 2 seeds cannot reach p < 0.05 for any split), and the RMST
difference is reported as the effect size.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

from orchestrator.stats.intervals import NAN, Interval


@dataclasses.dataclass(frozen=True)
class Observation:
    """One trial: ``time`` (its verdict step if ``event``, else its last observed step)."""

    time: float
    event: bool


@dataclasses.dataclass(frozen=True)
class KMStep:
    """The Kaplan-Meier curve just after ``time``: at risk, events, survival and its band."""

    time: float
    at_risk: int
    events: int
    survival: float
    low: float
    high: float


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def kaplan_meier(obs: Sequence[Observation], level: float = 0.95) -> list[KMStep]:
    """The curve at each distinct event time (censorings only shrink the risk set): survival and
    its log(-log) band from ``scipy.stats.ecdf``; the risk set and event counts (for the RMST
    variance) counted here."""
    times = sorted({o.time for o in obs if o.event})
    if not times:
        return []
    import warnings

    from scipy import stats  # deferred: slow to import

    sf = stats.ecdf(_censored(obs)).sf
    with warnings.catch_warnings():
        # scipy warns where the band is undefined: after the last trial collapsed (S = 0).
        warnings.simplefilter("ignore", RuntimeWarning)
        band = sf.confidence_interval(level, method="log-log")
    surv, low, high = sf.evaluate(times), band.low.evaluate(times), band.high.evaluate(times)
    out = []
    for t, s, lo, hi in zip(times, surv, low, high):
        n = sum(1 for o in obs if o.time >= t)
        d = sum(1 for o in obs if o.time == t and o.event)
        s = float(s)
        # S = 0 (every trial at risk collapsed): the band is the point 0.
        lo, hi = (0.0, 0.0) if s <= 0 or not math.isfinite(lo) else (float(lo), float(hi))
        out.append(KMStep(t, n, d, s, lo, hi))
    return out


def _censored(obs: Sequence[Observation]) -> Any:
    """``obs`` as ``scipy.stats.CensoredData`` (events exact, the rest right-censored)."""
    from scipy import stats

    return stats.CensoredData(uncensored=[o.time for o in obs if o.event],
                              right=[o.time for o in obs if not o.event])


def _first_below_half(curve: Sequence[KMStep], attr: str) -> float:
    return next((s.time for s in curve if getattr(s, attr) <= 0.5), math.inf)


def median_time(obs: Sequence[Observation], level: float = 0.95) -> Interval:
    """Median time to collapse with its interval (``inf``: not reached)."""
    if not obs:
        return NAN
    curve = kaplan_meier(obs, level)
    # The lower band reaches 0.5 first: that time is the median's lower limit.
    return Interval(_first_below_half(curve, "survival"), _first_below_half(curve, "low"),
                    _first_below_half(curve, "high"), len(obs))


def rmst(obs: Sequence[Observation], horizon: float, level: float = 0.95) -> tuple[Interval, float]:
    """Restricted mean survival time up to ``horizon`` with its interval, and its variance."""
    if not obs:
        return NAN, math.nan
    curve = [s for s in kaplan_meier(obs, level) if s.time <= horizon]
    # Area under the step function: survival 1 until the first event, then each step's value.
    knots = [0.0] + [s.time for s in curve] + [float(horizon)]
    values = [1.0] + [s.survival for s in curve]
    pieces = [values[i] * (knots[i + 1] - knots[i]) for i in range(len(values))]
    area = sum(pieces)
    var = 0.0
    for j, s in enumerate(curve):
        tail = sum(pieces[j + 1:])  # area from this event time to the horizon
        if s.at_risk > s.events:
            var += tail * tail * s.events / (s.at_risk * (s.at_risk - s.events))
    half = _z(level) * math.sqrt(var)
    return Interval(area, max(area - half, 0.0), min(area + half, float(horizon)), len(obs)), var


def rmst_difference(a: Sequence[Observation], b: Sequence[Observation], horizon: float,
                    level: float = 0.95) -> Interval:
    """RMST of ``a`` minus RMST of ``b`` (positive: ``a`` collapses later), normal interval."""
    if not a or not b:
        return NAN
    (ra, va), (rb, vb) = rmst(a, horizon, level), rmst(b, horizon, level)
    d, half = ra.estimate - rb.estimate, _z(level) * math.sqrt(va + vb)
    return Interval(d, d - half, d + half, len(a) + len(b))


def logrank_p(a: Sequence[Observation], b: Sequence[Observation]) -> float:
    """Two-sided log-rank p-value of ``a`` against ``b``: 1.0 (no evidence) when neither has an
    event, or when no event happens while both have a trial at risk (the test's variance is 0:
    e.g. every collapse of ``a`` after the last trial of ``b`` was censored)."""
    if not a or not b:
        return math.nan
    if not any(o.event for o in (*a, *b)):
        return 1.0
    import warnings

    from scipy import stats  # deferred: slow to import

    with warnings.catch_warnings():  # scipy divides by a zero variance in the case above
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.logrank(_censored(a), _censored(b)).pvalue)
    return p if math.isfinite(p) else 1.0


__all__ = ["KMStep", "Observation", "kaplan_meier", "logrank_p", "median_time", "rmst",
           "rmst_difference"]
