"""Time to collapse as survival data: the estimators against lifelines 0.30.3 and by hand.

lifelines is not installed here (0.30.3 pins pandas < 3); its figures below were computed with
lifelines 0.30.3 (``KaplanMeierFitter``, ``median_survival_times`` of the confidence bands,
``restricted_mean_survival_time``, ``logrank_test``) on the same data.
"""
from __future__ import annotations

import math

import pytest

from orchestrator.stats.survival import (
    Observation,
    kaplan_meier,
    logrank_p,
    median_time,
    rmst,
    rmst_difference,
)


def _obs(times: list[float], events: list[int]) -> list[Observation]:
    return [Observation(t, bool(e)) for t, e in zip(times, events)]


A = _obs([5, 8, 12, 20, 20, 20, 30, 31, 40, 40], [1, 1, 0, 1, 0, 0, 1, 1, 0, 1])
B = _obs([50, 50, 45, 12, 50], [0, 0, 1, 1, 0])


def test_kaplan_meier_and_its_band_match_lifelines() -> None:
    curve = kaplan_meier(A)
    assert [s.time for s in curve] == [5, 8, 20, 30, 31, 40]  # censorings are no steps
    lifelines_sf = [0.9, 0.8, 0.685714285714, 0.514285714286, 0.342857142857, 0.171428571429]
    lifelines_lo = [0.473009271362, 0.408690781633, 0.304585074202, 0.143498258121, 0.054349176917,
                    0.008549934753]
    lifelines_hi = [0.985281393367, 0.945872645839, 0.887148495028, 0.796310084014, 0.674727317404,
                    0.5203979752]
    for s, sf, lo, hi in zip(curve, lifelines_sf, lifelines_lo, lifelines_hi):
        assert s.survival == pytest.approx(sf, abs=1e-9)
        assert (s.low, s.high) == (pytest.approx(lo, abs=1e-9), pytest.approx(hi, abs=1e-9))


def test_median_and_its_interval_match_lifelines() -> None:
    m = median_time(A)
    assert (m.estimate, m.low, m.high) == (31, 5, math.inf)  # lifelines: 31.0, [5, inf]
    # Fewer than half collapsed: the median is not reached.
    assert median_time(_obs([10, 100, 100], [1, 0, 0])).estimate == math.inf


def test_rmst_matches_lifelines_and_its_variance_the_hand_computation() -> None:
    assert rmst(A, 35)[0].estimate == pytest.approx(26.042857142857137)  # lifelines
    # By hand: S = 1 to step 5, 5/6 to 8, 4/6 to 20 (the censoring at 12 drops no step):
    # 5 + 3 * 5/6 + 12 * 4/6 = 15.5; variance A_j^2 d_j / (n_j (n_j - d_j)) over the events
    # before 20: (10.5^2 / 30) + (8^2 / 20) = 6.875 (the event at 20 has nothing after it).
    hand = _obs([5, 8, 12, 20, 20, 20], [1, 1, 0, 1, 0, 0])
    iv, var = rmst(hand, 20)
    assert iv.estimate == pytest.approx(15.5) and var == pytest.approx(6.875)
    assert iv.low == pytest.approx(15.5 - 1.959963984540054 * math.sqrt(6.875))
    # Nobody collapsed: every step up to the horizon is collapse-free, with no uncertainty.
    none = rmst(_obs([20, 20], [0, 0]), 20)[0]
    assert (none.estimate, none.low, none.high) == (20, 20, 20)


def test_rmst_interval_stays_inside_zero_to_horizon() -> None:
    iv = rmst(_obs([2, 3, 20], [1, 1, 0]), 20)[0]
    assert 0 <= iv.low <= iv.estimate <= iv.high <= 20


def test_log_rank_matches_lifelines() -> None:
    assert logrank_p(A, B) == pytest.approx(0.08887599531450681, rel=1e-9)
    early = _obs([10, 10, 10, 50, 50], [1, 1, 1, 0, 0])
    assert logrank_p(early, B) == pytest.approx(0.3806290341163586, rel=1e-9)
    assert logrank_p(_obs([5, 6], [0, 0]), _obs([5, 6], [0, 0])) == 1.0  # no event: no evidence


def test_rmst_difference_is_later_minus_earlier() -> None:
    later = _obs([50] * 5, [0] * 5)
    d = rmst_difference(later, B, 50)
    assert d.estimate == pytest.approx(50 - rmst(B, 50)[0].estimate) and d.estimate > 0
    assert d.low < d.estimate < d.high


@pytest.mark.filterwarnings("error")
def test_curve_that_reaches_zero_has_a_point_band_and_no_warning() -> None:
    # scipy leaves the log(-log) band undefined (nan, with a RuntimeWarning) where S = 0.
    curve = kaplan_meier(_obs([2, 3, 3], [1, 1, 1]))
    assert [(s.time, s.at_risk, s.events) for s in curve] == [(2, 3, 1), (3, 2, 2)]
    assert (curve[-1].survival, curve[-1].low, curve[-1].high) == (0.0, 0.0, 0.0)
    assert 0 < curve[0].low < curve[0].survival < curve[0].high < 1


def test_log_rank_without_a_shared_risk_set_is_no_evidence_and_silent() -> None:
    """Every collapse of one arm comes after the other arm's last trial was censored: the test's
    variance is 0; scipy gives nan with a RuntimeWarning, the comparison must read p = 1."""
    import warnings

    late = _obs([50, 60], [1, 1])
    short = _obs([10, 20], [0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert logrank_p(late, short) == 1.0
        assert logrank_p(short, late) == 1.0
