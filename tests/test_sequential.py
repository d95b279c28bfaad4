"""Group-sequential boundaries (Lan-DeMets O'Brien-Fleming spending) against published values
and a simulation of their error rate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.stats.sequential import Boundaries, boundaries, crossed, obf_spent, z_of_p


def test_boundaries_match_gsdesign() -> None:
    # gsDesign 3.x, gsDesign(k, test.type = 2, alpha = 0.025, sfu = sfLDOF, timing = equal)$upper$bound
    assert boundaries([0.2, 0.4, 0.6, 0.8, 1.0]) == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=2e-4)
    assert boundaries([1 / 3, 2 / 3, 1.0]) == pytest.approx([3.7103, 2.5114, 1.9930], abs=2e-4)
    assert boundaries([0.5, 1.0]) == pytest.approx([2.9626, 1.9686], abs=2e-4)
    assert boundaries([1.0]) == pytest.approx([1.959964], abs=1e-5)  # one look: the fixed test


def test_spending_is_alpha_at_the_end_and_nothing_without_information() -> None:
    assert obf_spent(1.0) == pytest.approx(0.05) and obf_spent(0.0) == 0.0
    assert boundaries([0.5, 0.5, 0.25, 1.0])[1:3] == [math.inf, math.inf]  # no new information
    b = Boundaries(0.05)
    assert [b.add(t) for t in (0.2, 0.4)] == pytest.approx(boundaries([0.2, 0.4]))


def test_irregular_looks_keep_the_error_rate() -> None:
    # Brownian motion at 12 irregular looks under no difference: a path crosses a boundary in
    # 5% of runs (the naive "p < 0.05 at any look" in about 20%).
    rng = np.random.default_rng(7)
    t = np.array([0.03, 0.1, 0.12, 0.2, 0.33, 0.41, 0.5, 0.62, 0.7, 0.8, 0.93, 1.0])
    inc = rng.standard_normal((40_000, len(t))) * np.sqrt(np.diff(t, prepend=0.0))
    z = np.abs(np.cumsum(inc, axis=1) / np.sqrt(t))
    c = np.array(boundaries(list(t)))
    assert (z >= c).any(axis=1).mean() == pytest.approx(0.05, abs=0.004)
    assert (z >= 1.959964).any(axis=1).mean() > 0.15


def test_crossed_reads_p_values() -> None:
    assert z_of_p(0.05) == pytest.approx(1.959964, abs=1e-5) and z_of_p(1.0) == 0.0
    assert not crossed([(0.3, 0.001)])  # |Z| 3.29 early: below the boundary 4.0 there
    assert crossed([(0.3, 0.2), (1.0, 0.04)])  # at the end a little above 1.96 suffices
    assert not crossed([])
