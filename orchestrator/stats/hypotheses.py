"""Tests on declared comparisons: p-values, many comparisons at once, equivalence.

- **p-value of an interval**: the smallest ``1 - level`` at which the comparison's interval
  (``orchestrator.stats.intervals``) still excludes 0. For Welch's interval this is Welch's p-value; for
  Newcombe's it is the test that interval inverts. So with one comparison "p < 1 - level" is
  exactly "the interval excludes 0", and the p-values and intervals never disagree.
- **Multiplicity**: a grid's declared comparisons on one target are one family. Holm's step-down
  adjustment (controls the family-wise error rate, no assumption on dependence) by default;
  Benjamini-Hochberg (false discovery rate; ``scipy.stats.false_discovery_control``) when the grid
  says ``multiplicity: bh``; ``none`` leaves them as they are. A comparison is *decided* when its
  adjusted p-value is below ``1 - level``.
- **Equivalence** (TOST, two one-sided tests at ``alpha = 1 - level``): *equivalent* when the
  ``1 - 2 alpha`` interval of the difference lies inside ``(-margin, margin)``; *not equivalent*
  when the ``level`` interval lies entirely outside it (the difference is shown to exceed the
  margin); *inconclusive* otherwise. "No significant difference" is not equivalence: at 3 seeds a
  wide interval includes 0 and +-0.2 alike.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from orchestrator.stats.intervals import Interval

METHODS = ("holm", "bh", "none")


def p_from_interval(interval_at: Callable[[float], Interval], tol: float = 1e-6) -> float:
    """Smallest ``alpha`` whose ``1 - alpha`` interval excludes 0 (NaN: no interval at all).

    ``interval_at(level)`` must give nested intervals (wider at a higher level), as every
    interval in ``orchestrator.stats.intervals`` does; bisection on ``alpha``.
    """
    if not _finite(interval_at(0.5)):
        return math.nan
    lo, hi = 1e-12, 1 - 1e-9  # alpha: the interval at level 1 - alpha
    if not _decided(interval_at, hi):
        return 1.0  # even a point-sized interval holds 0: the estimate is 0
    if _decided(interval_at, lo):
        return lo
    while hi - lo > tol:
        a = (lo + hi) / 2
        if _decided(interval_at, a):
            hi = a
        else:
            lo = a
    return hi


def _finite(iv: Interval) -> bool:
    return math.isfinite(iv.low) and math.isfinite(iv.high)


def _decided(interval_at: Callable[[float], Interval], alpha: float) -> bool:
    return interval_at(1 - alpha).decided


def adjust(p_values: Sequence[float], method: str = "holm") -> list[float]:
    """Adjusted p-values of one family (NaN entries stay NaN and do not count)."""
    if method not in METHODS:
        raise ValueError(f"unknown multiplicity method {method!r}; allowed: {', '.join(METHODS)}")
    idx = [i for i, p in enumerate(p_values) if math.isfinite(p)]
    out = [math.nan] * len(p_values)
    if method == "none" or not idx:
        for i in idx:
            out[i] = float(p_values[i])
        return out
    ps = [float(p_values[i]) for i in idx]
    if method == "bh":
        from scipy import stats

        adj = [float(v) for v in stats.false_discovery_control(ps, method="bh")]
    else:
        order = sorted(range(len(ps)), key=ps.__getitem__)
        m, running, adj = len(ps), 0.0, [0.0] * len(ps)
        for rank, j in enumerate(order):
            # Holm: the k-th smallest times (m - k + 1), made monotone.
            running = max(running, min(1.0, (m - rank) * ps[j]))
            adj[j] = running
    for i, v in zip(idx, adj):
        out[i] = v
    return out


def equivalence(interval_at: Callable[[float], Interval], margin: float, level: float = 0.95) -> str:
    """TOST verdict at ``margin``: ``equivalent`` | ``not_equivalent`` | ``inconclusive``."""
    alpha = 1 - level
    inner = interval_at(1 - 2 * alpha)
    if not _finite(inner):
        return "inconclusive"
    if -margin < inner.low and inner.high < margin:
        return "equivalent"
    outer = interval_at(level)
    if outer.low >= margin or outer.high <= -margin:
        return "not_equivalent"
    return "inconclusive"


__all__ = ["METHODS", "adjust", "equivalence", "p_from_interval"]
