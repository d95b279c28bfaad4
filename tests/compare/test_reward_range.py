"""A grid's declared reward range (``metrics: {range: {reward: [lo, hi]}}``) bounds the reward
intervals of ``ablate compare``'s cells (cells.csv, the tables)."""
from __future__ import annotations

import csv
from pathlib import Path

from orchestrator import metrics as M
from orchestrator.compare._data import Segment, TrialResult
from orchestrator.compare._report import build_report


def _result(i: int, final: float) -> TrialResult:
    curve = [(1, 0.0), (2, final)]
    return TrialResult(
        trial_id=f"t{i:012x}", run_id=f"{i:032x}", axes={"corr": "none"}, seed=i, pool="sim-h100",
        status="done", verdict="healthy", verdict_step=None, verdict_reason="", derived_from=None,
        curves={M.TRAIN_REWARD: curve}, latest={}, segments=[Segment(1, "sim-h100", 1, 2)])


def _cell(out: Path, **kw: object) -> dict[str, float]:
    results = [_result(i, r) for i, r in enumerate([-0.99, -0.95, -0.2])]
    build_report(results, ["corr"], None, None, out, grid_name="g", store="s", **kw)  # type: ignore[arg-type]
    with open(out / "cells.csv") as fh:
        row = next(csv.DictReader(fh))
    return {k: float(row[k]) for k in ("final_reward", "final_reward_lo", "final_reward_hi")}


def test_declared_range_keeps_the_reward_interval_inside_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = _cell(tmp_path / "a")  # rewards outside the default [0, 1]: a plain t interval
    assert plain["final_reward_lo"] < -1
    bounded = _cell(tmp_path / "b", reward_range=(-1.0, 1.0))
    assert -1 < bounded["final_reward_lo"] < bounded["final_reward"] < bounded["final_reward_hi"] < 1
    assert bounded["final_reward"] == plain["final_reward"]
