"""p-values of intervals, multiplicity adjustment and equivalence (TOST)."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from orchestrator.stats.hypotheses import adjust, equivalence, p_from_interval
from orchestrator.stats.intervals import (
    bounded_mean,
    mean_difference,
    paired_difference,
    t_interval,
)

XS = [0.5, 0.6, 0.55, 0.7]
YS = [0.4, 0.45, 0.5, 0.42, 0.3]


def test_p_of_welch_interval_is_welchs_p() -> None:
    p = p_from_interval(lambda lv: mean_difference(XS, YS, lv))
    assert p == pytest.approx(stats.ttest_ind(XS, YS, equal_var=False).pvalue, abs=1e-5)
    assert p_from_interval(lambda lv: mean_difference(XS, XS, lv)) == 1.0
    assert math.isnan(p_from_interval(lambda lv: mean_difference([1.0], [2.0], lv)))


def test_holm_and_bh_by_hand() -> None:
    ps = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> monotone.
    assert adjust(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: p_(k) * m / k, then the running minimum from the top: 0.02, 0.02, 0.04, 0.04.
    assert adjust(ps, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust(ps, "none") == ps
    out = adjust([0.01, math.nan, 0.02])  # NaN (no interval yet) is not a hypothesis tested
    assert math.isnan(out[1]) and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.02)


def test_equivalence_three_ways() -> None:
    def at(lv: float):
        return mean_difference(XS, YS, lv)

    # The 90% interval of the difference (~0.06 to 0.24) lies inside +-0.5: equivalent at 0.5.
    assert equivalence(at, 0.5) == "equivalent"
    # It lies wholly above 0.02 at 95%: shown to differ by more than the margin.
    assert equivalence(at, 0.02) == "not_equivalent"
    assert equivalence(at, 0.1) == "inconclusive"
    # No significant difference is not equivalence: two seeds, wide interval.
    assert equivalence(lambda lv: mean_difference([0.4, 0.6], [0.5, 0.45], lv), 0.05) == "inconclusive"


def test_bounded_mean_stays_inside_the_range() -> None:
    t = t_interval([0.02, 0.8])
    b = bounded_mean([0.02, 0.8])
    assert t.low < 0 and t.high > 1  # the quickstart's "0.41 +- 1.31"
    assert 0 <= b.low < b.estimate < b.high <= 1 and b.estimate == t.estimate
    # Many seeds near the middle: the same as the t interval to two decimals.
    xs = [0.5, 0.52, 0.55, 0.49, 0.51, 0.53]
    assert bounded_mean(xs).low == pytest.approx(t_interval(xs).low, abs=0.005)
    assert bounded_mean([0.0, 0.0, 0.0]).high == 0.0  # all seeds at the bound: that point
    assert bounded_mean([1.5, 0.2]).low == t_interval([1.5, 0.2]).low  # outside [0, 1]: plain t


def test_paired_difference_removes_the_seed_effect() -> None:
    base = [0.2, 0.5, 0.8, 0.35]
    arm = [b + 0.05 + e for b, e in zip(base, [0.01, -0.01, 0.0, 0.005])]
    assert not mean_difference(arm, base).decided
    assert paired_difference(list(zip(arm, base))).decided
