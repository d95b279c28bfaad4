"""Statistics for ``ablate compare``: per-cell aggregates over seeds (mean and 95% interval:
``orchestrator.stats.intervals.bounded_mean``, inside the reward's range: [0, 1] unless the grid
declares ``metrics: {range: {reward: [lo, hi]}}``), and per-axis main effects and fANOVA importance (Optuna's evaluator over the finished trials)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare import _reference as reference
from orchestrator.compare._data import TrialResult
from orchestrator.schema import DEFAULT_RANGE
from orchestrator.stats.intervals import bounded_mean


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the Student-t CI, n) over the finite values; half-width NaN if n < 2."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan, math.nan, 0
    if len(xs) < 2:
        return xs[0], math.nan, 1
    from scipy import stats

    sd = statistics.stdev(xs)
    half = float(stats.t.ppf(0.5 + level / 2, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return statistics.fmean(xs), half, len(xs)


def cell_stats(results: Sequence[TrialResult], reward_range: tuple[float, float] = DEFAULT_RANGE) -> dict[str, Any]:
    """Aggregates of the trials (seeds) in one table cell (reward intervals inside ``reward_range``)."""
    reward = [r.final(r.reward_key) for r in results]
    peak = [r.peak(r.reward_key) for r in results]
    judged = [r for r in results if r.collapsed is not None]
    collapsed = [r for r in judged if r.collapsed]
    steps = [r.verdict_step for r in collapsed if r.verdict_step is not None]
    k3 = [r.peak(M.K3_KL) for r in results]
    final, top = bounded_mean(reward, *reward_range), bounded_mean(peak, *reward_range)
    k3_finite = [v for v in k3 if math.isfinite(v)]
    return {
        "n": len(results), "n_reward": final.n,
        "final_reward": final.estimate, "final_reward_lo": final.low, "final_reward_hi": final.high,
        "peak_reward": top.estimate, "peak_reward_lo": top.low, "peak_reward_hi": top.high,
        "n_judged": len(judged), "n_collapsed": len(collapsed),
        "collapse_rate": len(collapsed) / len(judged) if judged else math.nan,
        "median_collapse_step": statistics.median(steps) if steps else math.nan,
        "n_unstable": sum(1 for r in results if r.verdict == "unstable"),
        "n_infra_failure": sum(1 for r in results if r.verdict == "infra_failure"),
        "max_k3_kl": max(k3_finite) if k3_finite else math.nan,
        "skipped_share": _mean_finite([r.skipped_share for r in results]),
        "reward_metric": results[0].reward_key if results else "",
        **reference.cell_stats(results, reward_range),  # eval/reward_ref, where recorded
    }


def _mean_finite(xs: Sequence[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(finite) if finite else math.nan


def _fmt(v: float, digits: int = 3) -> str:
    return "–" if not math.isfinite(v) else f"{v:.{digits}f}"


def format_cell(s: dict[str, Any], sep: str = "<br>") -> str:
    """``final [lo, hi]`` / ``peak [lo, hi]`` / ``collapsed k/n @ median step`` / ``k3 max``
    in one cell (the interval's bounds, not a ``±`` that could cross the metric's range)."""
    def pm(m: float, lo: float, hi: float) -> str:
        return _fmt(m) + ("" if not math.isfinite(lo) else f" [{_fmt(lo)}, {_fmt(hi)}]")

    coll = f"collapse {s['n_collapsed']}/{s['n_judged']}"
    if math.isfinite(s["median_collapse_step"]):
        coll += f" @ {s['median_collapse_step']:g}"
    k3 = "–" if not math.isfinite(s["max_k3_kl"]) else f"{s['max_k3_kl']:.2e}"
    return sep.join([f"final {pm(s['final_reward'], s['final_reward_lo'], s['final_reward_hi'])}",
                     f"peak {pm(s['peak_reward'], s['peak_reward_lo'], s['peak_reward_hi'])}", coll,
                     f"max k3 {k3}"]
                    + ([f"ref final {pm(s['final_reward_ref'], s['final_reward_ref_lo'], s['final_reward_ref_hi'])}"]
                       if math.isfinite(s.get("final_reward_ref", math.nan)) else [])
                    # fp16 learners: the share of updates their loss scaler skipped
                    + ([f"skipped {s['skipped_share']:.1%}"]
                       if math.isfinite(s.get("skipped_share", math.nan)) else []))


def main_effects(results: Sequence[TrialResult], axes: Sequence[str]) -> list[dict[str, Any]]:
    """Per axis value: mean final reward and collapse rate; the effect is the spread of the means."""
    rows = []
    for axis in axes:
        values = sorted({r.axes.get(axis, "") for r in results})
        if len(values) < 2:
            continue
        for target in ("final_reward", "collapse_rate"):
            means = {}
            for v in values:
                group = [r for r in results if r.axes.get(axis, "") == v]
                if target == "final_reward":
                    means[v] = mean_ci([r.final(r.reward_key) for r in group])[0]
                else:
                    judged = [r for r in group if r.collapsed is not None]
                    means[v] = sum(bool(r.collapsed) for r in judged) / len(judged) if judged else math.nan
            finite = [m for m in means.values() if math.isfinite(m)]
            effect = max(finite) - min(finite) if len(finite) > 1 else math.nan
            rows.append({"axis": axis, "target": target, "effect": effect,
                         "means": {v: means[v] for v in values}})
    return rows


# Optuna one-hot encodes a categorical param, and its fANOVA tree then visits every
# combination of the split columns of that param: 2**levels points per tree, so an axis of 15
# values cost ~200 s and one of 50 would never finish. An axis with more values than this is
# given to the forest as its rank instead (one ordered column: at most levels - 1 midpoints).
MAX_ONE_HOT = 8


def _rank_order(labels: set[str]) -> list[str]:
    """An axis's labels in numeric order when they are all numbers (a learning rate), else sorted."""
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


def fanova_encoding(results: Sequence[TrialResult], axes: Sequence[str]) -> dict[str, str]:
    """How each varying axis enters the fANOVA forest: ``categorical`` (one-hot, Optuna's
    default) up to ``MAX_ONE_HOT`` values, ``rank`` (its values' order) past it."""
    out = {}
    for a in axes:
        n = len({r.axes.get(a, "") for r in results})
        if n > 1:
            out[a] = "categorical" if n <= MAX_ONE_HOT else "rank"
    return out


def fanova_importance(results: Sequence[TrialResult], axes: Sequence[str], target: str,
                      seed: int = 0) -> dict[str, float]:
    """fANOVA importance of each varying axis for ``target`` (final_reward | collapsed).

    Each finished trial becomes a completed Optuna trial with its axis labels as params;
    Optuna's ``FanovaImportanceEvaluator`` (random forest + functional ANOVA) does the rest.
    An axis of up to ``MAX_ONE_HOT`` values is a categorical param (as Optuna encodes it); a
    longer one is the rank of its value (``fanova_encoding``), which keeps the cost linear in
    the values instead of exponential. Returns {} when the target does not vary or fewer than
    3 trials qualify.
    """
    import optuna

    encoding = fanova_encoding(results, axes)
    varying = list(encoding)
    points = []
    for r in results:
        y = (r.final(r.reward_key) if target == "final_reward"
             else (math.nan if r.collapsed is None else float(bool(r.collapsed))))
        if math.isfinite(y):
            points.append(({a: r.axes.get(a, "") for a in varying}, y))
    if not varying or len(points) < 3 or len({y for _, y in points}) < 2:
        return {}
    dists: dict[str, optuna.distributions.BaseDistribution] = {}
    ranks: dict[str, dict[str, int]] = {}
    for a in varying:
        labels = {p[a] for p, _ in points}
        if encoding[a] == "categorical" or len(labels) < 2:
            dists[a] = optuna.distributions.CategoricalDistribution(sorted(labels))
        else:
            ranks[a] = {v: i for i, v in enumerate(_rank_order(labels))}
            dists[a] = optuna.distributions.IntDistribution(0, len(labels) - 1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trials([optuna.trial.create_trial(
        params={a: ranks[a][v] if a in ranks else v for a, v in p.items()}, distributions=dists, value=y)
        for p, y in points])
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    try:
        return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))
    except RuntimeError as e:
        # Targets that differ only in the last bits (0.5 and 0.5 + 1e-12) leave every tree
        # of the forest without variance: Optuna raises, and the importance is undefined.
        if "zero total variance" in str(e):
            return {}
        raise


def fanova_note(results: Sequence[TrialResult], axis_names: Sequence[str]) -> str | None:
    """What the fANOVA forest was fitted on, when an axis entered it as a rank (None otherwise:
    every axis categorical, Optuna's own encoding)."""
    enc = fanova_encoding(results, axis_names)
    ranked = [a for a, how in enc.items() if how == "rank"]
    if not ranked:
        return None
    sizes = ", ".join(f"{a} ({len({r.axes.get(a, '') for r in results})} values)" for a in ranked)
    return (f"fANOVA fitted on {len(results)} trials; axes with more than {MAX_ONE_HOT} values enter "
            f"it as the rank of their value (numeric order), not one-hot: {sizes}")
