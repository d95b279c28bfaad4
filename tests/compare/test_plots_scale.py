"""Plots of grids with many cells: every trial is drawn (axes past ``MAX_FACETS`` values share
named facets) and the verdict map stops growing."""
from __future__ import annotations

import os
import time
from pathlib import Path

import matplotlib.image

from orchestrator import metrics as M
from orchestrator.compare import _background as B
from orchestrator.compare import _plots as P
from orchestrator.compare._data import Segment, TrialResult
from orchestrator.compare._report import pivot


def _result(i: int, lr: str, pool: str) -> TrialResult:
    return TrialResult(
        trial_id=f"t{i:012x}", run_id=f"{i:032x}", axes={"lr": lr, "pool": pool}, seed=0,
        pool=pool, status="FINISHED", verdict="collapsed" if i % 3 == 0 else "healthy",
        verdict_step=3 if i % 3 == 0 else None, verdict_reason="", derived_from=None,
        curves={M.TRAIN_REWARD: [(s, 0.1 * s) for s in range(1, 6)]}, latest={},
        segments=[Segment(1, pool, 1, 5)])


def test_facets_past_the_limit_share_named_facets_and_drop_no_trial() -> None:
    results = [_result(i, f"{i:02d}", "p") for i in range(19)]
    facets = P._facets(results, "lr")
    assert len(facets) <= P.MAX_FACETS
    covered = [v for _, values in facets for v in values]
    assert sorted(covered) == sorted(r.axes["lr"] for r in results)  # each value exactly once
    assert facets[0][0] == "lr=00 … 02 (3 values)"
    assert P._facets(results[:3], "lr") == [(f"lr=0{i}", frozenset({f"0{i}"})) for i in range(3)]


def test_verdict_map_of_500_rows_keeps_a_sensible_size(tmp_path: Path) -> None:
    results = [_result(i, f"{i:04d}", pool) for i in range(500) for pool in ("a", "b")]
    cells = pivot(results, ["lr"], "pool")
    out = P.verdict_map(cells, ["lr"], "pool", tmp_path / "map.png")
    height_px = matplotlib.image.imread(out).shape[0]
    assert height_px <= P.MAX_MAP_HEIGHT_IN * 110 + 1  # 0.5 in a row would be 27,700 px
    small = P.verdict_map(pivot(results[:20], ["lr"], "pool"), ["lr"], "pool", tmp_path / "s.png")
    assert matplotlib.image.imread(small).shape[0] == round((0.5 * 10 + 1.8) * 110)


def _specs(d: Path) -> list[tuple[str, Path, str, bool]]:
    d.mkdir()
    return [(M.TRAIN_REWARD, d / "reward.png", "reward", False), (M.K3_KL, d / "k3.png", "k3", True)]


def test_curve_plots_in_a_forked_child_write_the_same_files(tmp_path: Path, monkeypatch) -> None:
    results = [_result(i, f"{i:02d}", pool) for i in range(12) for pool in ("a", "b")]
    parent, real, pids = os.getpid(), P.curves, tmp_path / "pids"

    def recorded(*args, **kwargs):  # which process drew each plot
        with pids.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(P, "curves", recorded)
    monkeypatch.setattr(B.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(B, "CHILD_FROM", 10**9)
    serial = P.curve_plots(results, _specs(tmp_path / "serial"), "lr", "pool")()
    assert pids.read_text().split() == [str(parent)] * 2
    pids.unlink()
    monkeypatch.setattr(B, "CHILD_FROM", 1)
    forked = P.curve_plots(results, _specs(tmp_path / "forked"), "lr", "pool")()
    assert serial == [tmp_path / "serial" / "reward.png", None]  # no trial has k3 KL
    assert forked == [tmp_path / "forked" / "reward.png", None]
    drawn_by = set(pids.read_text().split())
    assert drawn_by and str(parent) not in drawn_by
    assert (tmp_path / "serial" / "reward.png").read_bytes() == (tmp_path / "forked" / "reward.png").read_bytes()


def test_curve_plots_drawn_again_here_when_the_child_fails(tmp_path: Path, monkeypatch) -> None:
    results = [_result(i, f"{i:02d}", "a") for i in range(4)]
    parent, real = os.getpid(), P.curves

    def fails_in_child(*args, **kwargs):
        if os.getpid() != parent:
            raise RuntimeError("child")
        return real(*args, **kwargs)

    monkeypatch.setattr(P, "curves", fails_in_child)
    monkeypatch.setattr(B.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(B, "CHILD_FROM", 1)
    paths = P.curve_plots(results, _specs(tmp_path / "out"), "lr", None)()
    assert paths == [tmp_path / "out" / "reward.png", None]
    assert matplotlib.image.imread(paths[0]).shape[0] > 0


def test_background_returns_the_childs_value_and_reruns_here_when_it_fails(monkeypatch) -> None:
    parent = os.getpid()
    monkeypatch.setattr(B.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(B, "CHILD_FROM", 1)
    value = B.start(lambda: {"pid": os.getpid(), "x": 0.1 + 0.2}, trials=5)()
    assert value["pid"] != parent and value["x"] == 0.1 + 0.2  # ran in a child, float exact

    def fails_in_child() -> int:
        if os.getpid() != parent:
            raise RuntimeError("child")
        return os.getpid()

    assert B.start(fails_in_child, trials=5)() == parent
    monkeypatch.setattr(B, "CHILD_FROM", 10)
    assert B.start(os.getpid, trials=5)() == parent  # below CHILD_FROM: here


def test_background_kills_a_child_that_hangs_and_does_the_piece_here(monkeypatch) -> None:
    parent = os.getpid()
    monkeypatch.setattr(B.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(B, "CHILD_FROM", 1)
    monkeypatch.setattr(B, "CHILD_TIMEOUT_S", 1.0)

    def hangs_in_child() -> int:
        if os.getpid() != parent:
            time.sleep(60)  # a deadlocked child, as far as the parent can tell
        return os.getpid()

    started = time.monotonic()
    assert B.start(hangs_in_child, trials=5)() == parent
    assert time.monotonic() - started < 30
