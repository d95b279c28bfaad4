"""compare's reuse of its curve plots and fANOVA importance (``compare/_cache``): what a
reused run writes is byte for byte what drawing and fitting write, and a damaged entry is
ignored with one warning and rebuilt. Real MLflow runs (SQLite) of an 8-trial sim grid."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import trackedruns

from orchestrator.compare import _cache, _data, _plots, _report, compare
from orchestrator.tracking import client


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cache")
    with trackedruns.isolated_module(root):
        gfile, _ = trackedruns.record_grid(root, "cache.yaml", "cache-test")
        yield gfile, root


def _files(out: Path) -> dict[str, bytes]:
    # MANIFEST.json names the output directory (its regenerate command), which differs here.
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != "MANIFEST.json"}


def _run(gfile: Path, root: Path, out: str) -> dict[str, bytes]:
    return _files(compare(gfile, workdir=str(root / ".ablate"), out_dir=root / out))


def _no_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("drawn or fitted again although the trials are the same")
    monkeypatch.setattr(_plots, "curves", refuse)
    monkeypatch.setattr(_report, "fanova_importance", refuse)
    for name in ("mismatch_by_bucket", "verdict_map", "importance_bars"):
        monkeypatch.setattr(_plots, name, refuse)


def test_a_reused_compare_writes_the_same_bytes_without_drawing_again(grid, tmp_path, monkeypatch) -> None:
    gfile, root = grid
    monkeypatch.setenv("ABLATE_CACHE_DIR", "off")
    fresh = _run(gfile, root, "off")
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    first = _run(gfile, root, "first")
    _no_drawing(monkeypatch)
    again = _run(gfile, root, "again")
    assert fresh == first == again  # every table, figure, summary.md/.html byte for byte
    assert {"curves_reward.png", "curves_k3_kl.png", "importance.csv", "trials.csv"} <= set(again)


def test_a_damaged_entry_is_ignored_with_one_warning_and_rebuilt(grid, tmp_path, monkeypatch, caplog) -> None:
    gfile, root = grid
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    first = _run(gfile, root, "first")
    png = next((tmp_path / "cache").glob("*/curves_reward.png"))
    png.write_bytes(png.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger=_cache.__name__):
        redrawn = _run(gfile, root, "redrawn")
    damaged = [r for r in caplog.records if "damaged" in r.getMessage()]
    assert len(damaged) == 1 and redrawn == first
    _no_drawing(monkeypatch)  # the entry drawn again took the damaged one's place
    assert _run(gfile, root, "again") == first


def test_a_changed_trial_or_argument_is_another_key(grid) -> None:
    _, root = grid

    mlc = client(f"sqlite:///{root / '.ablate' / 'mlflow.db'}")
    exp = mlc.get_experiment_by_name("cache-test")
    results = _data.load_results(mlc, exp.experiment_id, ["correction.is_level", "pool"])
    base = _cache.key("curves", (results, "pool"))
    assert _cache.key("curves", (results, "pool")) == base
    changed = [dataclasses.replace(results[0], verdict="collapsed" if results[0].verdict != "collapsed"
                                   else "healthy"), *results[1:]]
    assert _cache.key("curves", (changed, "pool")) != base
    assert _cache.key("curves", (results, None)) != base
    assert _cache.key("fanova", (results, "pool")) != base
