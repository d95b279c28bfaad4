"""Group-sequential boundaries: deciding a comparison at interim looks without inflating its error.

A comparison looked at many times (after every finished trial, or on running trials' partial
data) and decided the first time its p-value falls below ``alpha`` is wrong more often than
``alpha``: each look is another chance. The Lan-DeMets alpha-spending approach fixes the total:
a spending function ``alpha(t)`` says how much of ``alpha`` may have been spent by *information
fraction* ``t`` in [0, 1] (``t = 1``: the largest experiment the grid allows), and look ``k`` at
fraction ``t_k`` rejects when ``|Z_k| >= c_k``, with ``c_k`` chosen so that, under no difference,

    P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}).

The statistics ``Z_k`` are taken as the canonical joint normal of a Brownian motion in
information time (``corr(Z_i, Z_j) = sqrt(t_i / t_j)``), as for the log-rank statistic
(Jennison and Turnbull, *Group Sequential Methods*, 2000, ch. 7 and 19). The probabilities are
computed by the recursive numerical integration of Armitage, McPherson and Rowe (1969) on a
grid; nothing in scipy or statsmodels computes group-sequential boundaries.

The spending function is Lan-DeMets' O'Brien-Fleming type, ``alpha / 2`` per side spent as
``2 - 2 Phi(z_{1-alpha/4} / sqrt(t))``: almost nothing is spent early (five equally spaced looks
need ``|Z| >= 4.88, 3.36, 2.68, 2.29, 2.03``, the published values) and the last look needs
little more than the fixed-sample ``1.96``, so stopping early costs the final analysis almost
no power.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

_N = NormalDist()
GRID_POINTS = 401  # points per look for the integration (the boundaries to ~1e-4)


def obf_spent(t: float, alpha: float = 0.05) -> float:
    """Lan-DeMets O'Brien-Fleming spending: how much of two-sided ``alpha`` is spent by ``t``
    (``alpha / 2`` on each side, each spent as the one-sided function, as gsDesign's
    ``sfLDOF`` with ``test.type = 2``)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    return 2.0 * (2.0 - 2.0 * _N.cdf(_N.inv_cdf(1 - alpha / 4) / math.sqrt(t)))


class Boundaries:
    """The boundaries of one comparison's looks at ``alpha``, one look at a time (``c_k`` depends
    only on the looks up to ``k``, so a look added later never moves an earlier boundary)."""

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.values: list[float] = []
        self._t = 0.0  # information fraction of the last look that spent something
        self._grid: Any = None  # the score S = Z sqrt(t) on the continuation region
        self._dens: Any = None  # its sub-density there (paths that crossed no boundary yet)

    def add(self, t: float) -> float:
        """The boundary of the next look, at information fraction ``t`` (``inf`` when it adds no
        information: ``t`` at or below the last look's)."""
        import numpy as np
        from scipy import optimize, stats

        t = min(max(float(t), 0.0), 1.0)
        spend = obf_spent(t, self.alpha) - obf_spent(self._t, self.alpha)
        if t <= self._t or spend <= 1e-15:
            self.values.append(math.inf)
            return math.inf
        if self._grid is None:  # the first look with information: a plain normal quantile
            c = _N.inv_cdf(1 - spend / 2)
            b = c * math.sqrt(t)
            self._grid = np.linspace(-b, b, GRID_POINTS)
            self._dens = stats.norm.pdf(self._grid, scale=math.sqrt(t))
        else:
            grid, mass = self._grid, self._dens * _simpson(self._grid)
            sd = math.sqrt(t - self._t)

            def crossing(c: float) -> float:
                b = c * math.sqrt(t)
                return float(np.sum(mass * (stats.norm.sf((b - grid) / sd) + stats.norm.cdf((-b - grid) / sd))))

            c = 0.0 if crossing(0.0) <= spend else optimize.brentq(
                lambda c: crossing(c) - spend, 0.0, 40.0, xtol=1e-8)
            b = c * math.sqrt(t)
            new = np.linspace(-b, b, GRID_POINTS)
            self._dens = (stats.norm.pdf((new[:, None] - grid[None, :]) / sd) / sd) @ mass
            self._grid = new
        self._t = t
        self.values.append(c)
        return c


def boundaries(fractions: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Two-sided boundaries ``c_1..c_K`` (on the |Z| scale) for looks at increasing information
    ``fractions`` (each in (0, 1]); a look that adds no information gets ``inf``."""
    b = Boundaries(alpha)
    return [b.add(t) for t in fractions]


def _simpson(grid: Any) -> Any:
    """Simpson's rule weights on an evenly spaced grid of an odd number of points."""
    import numpy as np

    h = grid[1] - grid[0]
    w = np.ones(len(grid))
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3.0


def z_of_p(p: float) -> float:
    """The |Z| of a two-sided p-value (0 for p >= 1, inf for p <= 0)."""
    if not math.isfinite(p) or p >= 1:
        return 0.0
    if p <= 0:
        return math.inf
    return _N.inv_cdf(1 - p / 2)


def crossed(looks: Sequence[tuple[float, float]], alpha: float = 0.05) -> bool:
    """Whether a comparison is decided at any of its ``looks`` ((information fraction, two-sided
    p-value) in the order taken) under the spending boundaries at ``alpha``."""
    if not looks:
        return False
    bounds = boundaries([t for t, _ in looks], alpha)
    return any(z_of_p(p) >= c for (_, p), c in zip(looks, bounds))


__all__ = ["Boundaries", "boundaries", "crossed", "obf_spent", "z_of_p"]
