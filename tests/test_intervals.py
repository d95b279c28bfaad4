"""Intervals against published values (Wilson: Newcombe 1998, single proportion; the
difference: Newcombe 1998, two independent proportions, method 10, examples (a)-(d)) and against scipy's Welch test."""
from __future__ import annotations

import math

import pytest

from orchestrator.stats.intervals import mean_difference, rate_difference, t_interval, wilson


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 3, 0.0, 0.5615), (1, 3, 0.0615, 0.7923), (3, 3, 0.4385, 1.0), (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605)])
def test_wilson_matches_published_values(k: int, n: int, low: float, high: float) -> None:
    iv = wilson(k, n)
    assert (iv.low, iv.high) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))
    assert iv.estimate == pytest.approx(k / n)


def test_wilson_is_not_degenerate_at_zero_and_narrows_with_n() -> None:
    widths = [wilson(0, n).width for n in (2, 4, 8, 16)]
    assert all(w > 0 for w in widths) and widths == sorted(widths, reverse=True)
    assert wilson(0, 0).width == math.inf


@pytest.mark.parametrize(("a", "b", "low", "high"), [
    ((56, 70), (48, 80), 0.0524, 0.3339), ((9, 10), (3, 10), 0.1705, 0.8090),
    ((6, 7), (2, 7), 0.0582, 0.8062), ((5, 56), (0, 29), -0.0381, 0.1926)])
def test_newcombe_difference_matches_published_examples(a, b, low, high) -> None:
    iv = rate_difference(*a, *b)
    assert iv.estimate == pytest.approx(a[0] / a[1] - b[0] / b[1])
    assert (iv.low, iv.high) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))
    assert iv.decided == (low > 0)


def test_newcombe_two_of_two_against_zero_of_two_is_decided_one_of_two_is_not() -> None:
    assert rate_difference(2, 2, 0, 2).decided
    assert not rate_difference(1, 2, 0, 2).decided
    assert not rate_difference(0, 5, 0, 5).decided  # no difference seen: never decided


def test_t_and_welch_intervals_match_scipy() -> None:
    from scipy import stats

    xs, ys = [0.61, 0.66, 0.58, 0.70], [0.50, 0.55, 0.47]
    iv = t_interval(xs)
    lo, hi = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / 4, scale=stats.sem(xs))
    assert (iv.low, iv.high) == (pytest.approx(lo), pytest.approx(hi))
    d = mean_difference(xs, ys)
    ci = stats.ttest_ind(xs, ys, equal_var=False).confidence_interval(0.95)
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.decided and not mean_difference(xs, xs[::-1]).decided
    assert math.isnan(t_interval([0.5]).low) and t_interval([0.5]).width == math.inf
