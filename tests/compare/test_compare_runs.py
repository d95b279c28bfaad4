"""compare's kept run list (``compare/_runs``): a compare of a grid whose store has not changed
since the list was read reads no run from MLflow and writes the same bytes; any write to the
store is read again; publishing what the parent run already holds writes nothing. Real MLflow
runs (SQLite) of an 8-trial sim grid."""
from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trackedruns

from orchestrator.compare import _cache, _data, _runs, compare
from orchestrator.tracking import check_store, client

AXES = ["correction.is_level", "pool"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "grid"
    root.mkdir()
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    with trackedruns.isolated_module(root):
        gfile, uri = trackedruns.record_grid(root, "runs.yaml", "runs-test")
        yield gfile, root, uri


def _run(gfile: Path, root: Path, out: str = "out") -> dict[str, bytes]:
    done = compare(gfile, workdir=str(root / ".ablate"), out_dir=root / out)
    return {p.name: p.read_bytes() for p in sorted(done.iterdir()) if p.is_file()}


def _no_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the runs were listed again although the store has not changed")
    monkeypatch.setattr(_runs, "search_trial_runs", refuse)


def test_an_unchanged_store_is_not_listed_again_and_writes_the_same_bytes(grid, monkeypatch) -> None:
    gfile, root, uri = grid
    first = _run(gfile, root)  # reads the runs, publishes to the parent run (a write)
    stamp = _runs.store_stamp(uri)
    second = _run(gfile, root)  # reads them again (the store changed); the parent holds them
    assert _runs.store_stamp(uri) == stamp  # so nothing was written
    with pytest.MonkeyPatch.context() as mp:
        _no_listing(mp)
        third = _run(gfile, root)
    assert first == second == third
    monkeypatch.setenv("ABLATE_CACHE_DIR", "off")
    assert _run(gfile, root) == first  # what a compare without any cache writes


@pytest.fixture()
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """20 finished trials of 10 steps recorded by the runner (the compare benchmark's generated
    trainer): the workdir holds every trial's summary, as after a submission."""
    root = tmp_path / "recorded"
    root.mkdir()
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compare_scale.py"), "--record",
                          str(root), "20", "10", "4", "tracked:1"], capture_output=True, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return root


COMPARE = """
import sys
from orchestrator.compare import compare
compare(sys.argv[1], workdir=sys.argv[2], out_dir=sys.argv[3])
print("mlflow imported:", "mlflow" in sys.modules)
"""


def test_with_the_workdir_an_unchanged_store_never_imports_mlflow(recorded: Path) -> None:
    def run() -> str:
        res = subprocess.run([sys.executable, "-c", COMPARE, str(recorded / "grid.yaml"),
                              str(recorded / "workdir"), str(recorded / "out")],
                             capture_output=True, text=True, timeout=300, check=False, cwd=recorded)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout.strip().splitlines()[-1]
    assert [run(), run(), run()] == ["mlflow imported: True"] * 2 + ["mlflow imported: False"]


def test_a_write_to_the_store_is_read_again(grid, monkeypatch) -> None:
    gfile, root, uri = grid
    _run(gfile, root)
    _run(gfile, root)  # the list is kept now
    mlc = client(uri)
    exp = mlc.get_experiment_by_name("runs-test").experiment_id
    run = _runs.search_trial_runs(mlc, exp)[0]
    mlc.set_tag(run.run_id, "verdict.reason", "edited in the MLflow UI")  # another writer
    trials = _run(gfile, root)["trials.csv"].decode()
    assert "edited in the MLflow UI" in trials


def test_a_read_leaves_the_stamp_and_a_write_changes_it(grid) -> None:
    _, _, uri = grid
    stamp = _runs.store_stamp(uri)
    assert stamp is not None
    check_store(uri)  # a read-only open leaves an empty WAL and its index behind
    mlc = client(uri)
    exp = mlc.get_experiment_by_name("runs-test").experiment_id
    run = _runs.search_trial_runs(mlc, exp)[0]
    assert _runs.store_stamp(uri) == stamp
    mlc.set_tag(run.run_id, "note", "x")
    assert _runs.store_stamp(uri) != stamp
    path = uri.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:  # a write by any client, MLflow's or not
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    after = _runs.store_stamp(uri)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE written_here (x)")
    assert _runs.store_stamp(uri) != after
    assert _runs.store_stamp("http://127.0.0.1:5000") is None  # a server: read every time


def test_kept_runs_load_the_same_results_and_keys(grid) -> None:
    gfile, root, uri = grid
    _run(gfile, root)
    stamp = _runs.store_stamp(uri)
    _run(gfile, root)
    kept = _runs.cached(uri, "runs-test", stamp)
    assert kept is not None and kept.cached
    mlc = client(uri)
    grid_dir = root / ".ablate" / "runs-test"
    live = _data.load_results(mlc, kept.experiment_id, AXES, grid_dir=grid_dir)
    again = _data.load_results(mlc, kept.experiment_id, AXES, grid_dir=grid_dir, runs=kept.runs)
    assert live == again
    # Equal values, whichever objects they share, are one key (MLflow's runs share strings).
    assert _cache.digest(live) == _cache.digest(again)


def test_a_damaged_kept_list_is_ignored_with_one_warning(grid, caplog) -> None:
    gfile, root, _ = grid
    first = _run(gfile, root)
    _run(gfile, root)
    (entry,) = Path(_cache.cache_dir()).glob("runs-*.json")
    entry.write_text(entry.read_text()[:200])  # truncated
    with caplog.at_level(logging.WARNING, logger=_runs.__name__):
        again = _run(gfile, root)
    assert again == first
    assert len([r for r in caplog.records if "damaged" in r.getMessage()]) == 1
