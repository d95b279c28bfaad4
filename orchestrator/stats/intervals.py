"""Confidence intervals for cells and for comparisons between cells.

- A cell's collapse rate (k collapsed of n judged trials): the **Wilson score interval**. It
  stays inside [0, 1] and is not degenerate at 0/n or n/n (a Wald interval is [0, 0] at 0/3).
- A cell's final reward: the Student t interval of the mean over seeds; for a bounded metric
  (every value inside ``[lo, hi]``, the reward in [0, 1]) the t interval on the logit scale of the
  mean (delta method, ``bounded_mean``), so it stays inside the range and is skewed away from the
  bound the mean is near. Small n: at 2 seeds (t = 12.7) it spans most of the range, as it should;
  when every seed sits on the same value the interval is that point.
- The difference of two collapse rates: **Newcombe's hybrid score interval** (method 10 of
  Newcombe 1998), built from the two Wilson intervals.
- The difference of two mean rewards: Welch's t interval (unequal variances); where the two cells
  share seeds and the seed fixes the task draws (``compare: {paired: true}``), the paired t
  interval over the shared seeds (``paired_difference``).

A comparison is *decided* when its interval excludes 0.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Sequence
from statistics import NormalDist


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate with its interval over ``n`` observations (NaN bounds: not enough data)."""

    estimate: float
    low: float
    high: float
    n: int

    @property
    def width(self) -> float:
        """``high - low``; ``inf`` when the interval is not defined yet."""
        w = self.high - self.low
        return w if math.isfinite(w) else math.inf

    @property
    def decided(self) -> bool:
        """For a difference: the interval excludes 0."""
        return math.isfinite(self.low) and math.isfinite(self.high) and (self.low > 0 or self.high < 0)


NAN = Interval(math.nan, math.nan, math.nan, 0)


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


@functools.lru_cache(maxsize=256)
def _t(level: float, df: float) -> float:
    """Student t quantile; cached: a 1,000-trial compare asks for a handful of (level, df)
    pairs hundreds of times, and scipy's lazy ``from scipy import stats`` costs ~1 ms a call."""
    from scipy import stats  # deferred: scipy is slow to import and ablate plan never needs it

    return float(stats.t.ppf(0.5 + level / 2, df))


def wilson(k: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval of the rate ``k / n``."""
    if n <= 0:
        return NAN
    z = _z(level)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(p, max(centre - half, 0.0), min(centre + half, 1.0), n)


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Student t interval of the mean of the finite ``values`` (NaN bounds below 2 values)."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return NAN
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = _t(level, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return Interval(mean, mean - half, mean + half, len(xs))


def rate_difference(k1: int, n1: int, k0: int, n0: int, level: float = 0.95) -> Interval:
    """Newcombe's hybrid score interval of ``k1/n1 - k0/n0``."""
    if n1 <= 0 or n0 <= 0:
        return NAN
    a, b = wilson(k1, n1, level), wilson(k0, n0, level)
    d = a.estimate - b.estimate
    low = d - math.sqrt((a.estimate - a.low) ** 2 + (b.high - b.estimate) ** 2)
    high = d + math.sqrt((a.high - a.estimate) ** 2 + (b.estimate - b.low) ** 2)
    return Interval(d, low, high, n1 + n0)


def mean_difference(xs: Sequence[float], ys: Sequence[float], level: float = 0.95) -> Interval:
    """Welch's t interval of ``mean(xs) - mean(ys)`` over the finite values."""
    a = [v for v in xs if math.isfinite(v)]
    b = [v for v in ys if math.isfinite(v)]
    if not a or not b:
        return NAN
    d = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Interval(d, math.nan, math.nan, len(a) + len(b))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(d, d, d, len(a) + len(b))
    df = (va + vb) ** 2 / ((va * va) / (len(a) - 1) + (vb * vb) / (len(b) - 1))
    half = _t(level, df) * se
    return Interval(d, d - half, d + half, len(a) + len(b))


def bounded_mean(values: Sequence[float], lo: float = 0.0, hi: float = 1.0,
                 level: float = 0.95) -> Interval:
    """Interval of the mean of values inside ``[lo, hi]``, kept inside the range: the t interval
    of the logit of the (rescaled) mean, by the delta method. Falls back to ``t_interval`` when
    a value lies outside the range (the metric is not bounded there)."""
    xs = [v for v in values if math.isfinite(v)]
    if any(v < lo or v > hi for v in xs) or not hi > lo:
        return t_interval(xs, level)
    base = t_interval(xs, level)
    if len(xs) < 2 or not math.isfinite(base.low):
        return base
    m = (base.estimate - lo) / (hi - lo)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) / (hi - lo)
    if se == 0 or m <= 0 or m >= 1:
        return Interval(base.estimate, base.estimate, base.estimate, len(xs))
    half = _t(level, len(xs) - 1) * se / (m * (1 - m))
    logit = math.log(m / (1 - m))

    def back(x: float) -> float:
        return lo + (hi - lo) / (1 + math.exp(-x))

    return Interval(base.estimate, back(logit - half), back(logit + half), len(xs))


def paired_difference(pairs: Sequence[tuple[float, float]], level: float = 0.95) -> Interval:
    """Paired t interval of ``mean(a - b)`` over the pairs with both values finite."""
    return t_interval([a - b for a, b in pairs if math.isfinite(a) and math.isfinite(b)], level)
