"""fANOVA importance stays bounded on long axes: an axis of more than ``MAX_ONE_HOT`` values
enters the forest as its rank (Optuna's one-hot encoding costs 2**values per tree), and a grid
whose axes are all short gets exactly Optuna's categorical fANOVA, as before."""
from __future__ import annotations

import random

import optuna
import pytest

from orchestrator import metrics as M
from orchestrator.compare._data import TrialResult
from orchestrator.compare._stats import (
    MAX_ONE_HOT,
    fanova_encoding,
    fanova_importance,
    fanova_note,
)


def _results(lrs: int, seeds: int = 3) -> list[TrialResult]:
    rnd = random.Random(0)
    out = []
    for i in range(lrs):
        for pool in ("a", "b"):
            for s in range(seeds):
                y = 0.3 + 0.02 * i + (0.05 if pool == "a" else 0.0) + rnd.gauss(0, 0.01)
                out.append(TrialResult(
                    trial_id=f"t{len(out)}", run_id="", axes={"lr": f"{1e-4 * (1 + i):.6g}", "pool": pool},
                    seed=s, pool=pool, status="FINISHED",
                    verdict="collapsed" if rnd.random() < 0.05 * i else "healthy", verdict_step=None,
                    verdict_reason="", derived_from=None, curves={M.EVAL_REWARD: [(1, y)]}, latest={},
                    segments=[], finals={M.EVAL_REWARD: y}, peaks={M.EVAL_REWARD: y}))
    return out


def _categorical_fanova(results: list[TrialResult], target: str) -> dict[str, float]:
    """The encoding before the bound: every axis a categorical param."""
    points = [({a: r.axes[a] for a in ("lr", "pool")},
               r.final(r.reward_key) if target == "final_reward" else float(bool(r.collapsed)))
              for r in results]
    dists = {a: optuna.distributions.CategoricalDistribution(sorted({p[a] for p, _ in points}))
             for a in ("lr", "pool")}
    study = optuna.create_study(direction="maximize")
    study.add_trials([optuna.trial.create_trial(params=p, distributions=dists, value=y) for p, y in points])
    return dict(optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)))


@pytest.mark.parametrize("target", ["final_reward", "collapsed"])
def test_short_axes_give_the_categorical_fanova_unchanged(target: str) -> None:
    results = _results(MAX_ONE_HOT)
    assert fanova_encoding(results, ["lr", "pool"]) == {"lr": "categorical", "pool": "categorical"}
    assert fanova_importance(results, ["lr", "pool"], target) == pytest.approx(_categorical_fanova(results, target))
    assert fanova_note(results, ["lr", "pool"]) is None  # nothing to say: the summary is as before


def test_a_long_axis_enters_as_its_numeric_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(40, seeds=2)  # one-hot: 2**40 points per tree, it would never end
    seen: list[dict[str, optuna.distributions.BaseDistribution]] = []
    real = optuna.trial.create_trial

    def spy(**kw):  # type: ignore[no-untyped-def]
        seen.append(kw["distributions"])
        return real(**kw)

    monkeypatch.setattr(optuna.trial, "create_trial", spy)
    imp = fanova_importance(results, ["lr", "pool"], "final_reward")
    assert seen[0]["lr"] == optuna.distributions.IntDistribution(0, 39)
    assert isinstance(seen[0]["pool"], optuna.distributions.CategoricalDistribution)
    assert imp["lr"] > imp["pool"]  # the reward rises with lr over 40 values: lr explains most
    note = fanova_note(results, ["lr", "pool"])
    assert note is not None and "lr (40 values)" in note and "160 trials" in note


def test_rank_order_is_numeric_not_lexical() -> None:
    from orchestrator.compare._stats import _rank_order

    assert _rank_order({"1e-05", "0.0002", "3e-05"}) == ["1e-05", "3e-05", "0.0002"]
    assert _rank_order({"b", "a", "c"}) == ["a", "b", "c"]


def test_a_target_that_differs_only_in_the_last_bits_has_no_importance_and_no_crash() -> None:
    """Final rewards 0.5, 0.5 and 0.5 + 1e-12 (three arms that learned the same): Optuna's
    forest finds no variance in any tree and raises; compare reports no importance instead of a
    traceback (a 3-trial grid compared while it ran hit this)."""
    results = _results(3, seeds=1)[:3]
    for r, y in zip(results, (0.5, 0.5, 0.5 + 1e-12), strict=True):
        r.curves[M.EVAL_REWARD] = [(1, y)]
        r.finals[M.EVAL_REWARD] = r.peaks[M.EVAL_REWARD] = y
    assert fanova_importance(results, ["lr", "pool"], "final_reward") == {}
