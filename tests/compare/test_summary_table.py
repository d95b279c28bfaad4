"""The grid's summary table (issue 58): one artifact of the parent run holding every finished
trial's summary, which a compare without the workdir reads instead of the trials' metric
histories, entry by entry only where the run's ``summary.*`` tags agree; a damaged or foreign
table is ignored with one warning and the tables come out the same."""
from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.compare import _data, compare
from orchestrator.store import summary_table
from orchestrator.store.summary import Stamp, TrialSummary
from orchestrator.tracking import client

REPO = Path(__file__).resolve().parents[2]
GRID = "compare-scale"  # the name benchmarks/compare_scale.py gives its grids


def _summary(last: int, final: float = 0.5) -> TrialSummary:
    curve = [(s, s / 10) for s in range(1, last + 1)]
    return TrialSummary(Stamp(100, 7, last), last, {"eval/reward": final, "actor/grad_norm": math.nan},
                        {"eval/reward": 0.9, "actor/grad_norm": math.nan},
                        {"eval/reward": last, "actor/grad_norm": 1},
                        {"eval/reward": curve, "actor/grad_norm": [(1, math.nan)]})


def test_a_table_reads_back_as_it_was_written_and_refuses_what_is_not_it() -> None:
    data = summary_table.encode("g", {"t1": _summary(3), "t2": _summary(600, final=math.nan)})
    back = summary_table.decode(data, "g")
    assert repr(back["t1"]) == repr(_summary(3))  # repr: NaN equals itself there
    assert len(back["t2"].curves["eval/reward"]) <= 520  # reduced as a summary is
    assert math.isnan(back["t2"].final["eval/reward"])
    for bad, why in ((data[: len(data) // 2], "not a readable table"),
                     (b"garbage", "not a readable table")):
        with pytest.raises(ValueError, match=why):
            summary_table.decode(bad, "g")
    with pytest.raises(ValueError, match="the table of grid 'g', not of 'other'"):
        summary_table.decode(data, "other")


def test_an_entry_is_taken_only_while_the_runs_tags_agree() -> None:
    s = _summary(3)
    tags = s.tags()
    assert summary_table.agrees(s, tags)
    assert not summary_table.agrees(s, {**tags, "summary.last_step": "4"})  # resumed since
    assert not summary_table.agrees(s, {**tags, "summary.peak.eval/reward": "0.95"})
    assert not summary_table.agrees(s, {})  # a run logged before summaries


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 finished trials of 30 steps recorded by the runner (the benchmark's generated
    trainer), its parent run ended by ``parent_run``, which publishes the table."""
    root = tmp_path_factory.mktemp("table")
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compare_scale.py"), "--record",
                          str(root), "20", "30", "8", "tracked:1"], capture_output=True, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def _compare(root: Path, out: str, monkeypatch, *, workdir: bool) -> tuple[Path, list[list[str]]]:
    fetched: list[list[str]] = []
    real = _data.fetch_curves
    monkeypatch.setattr(_data, "fetch_curves", lambda mlc, uri, wanted: (
        fetched.append(sorted(wanted)), real(mlc, uri, wanted))[1])
    monkeypatch.setenv("ABLATE_CACHE_DIR", "off")
    empty = root / "empty"
    empty.mkdir(exist_ok=True)
    wd = root / "workdir"
    path = compare(root / "grid.yaml", workdir=wd if workdir else empty,
                   tracking_uri=None if workdir else f"sqlite:///{wd / 'mlflow.db'}",
                   out_dir=root / out)
    return path, fetched


def _tables(out: Path) -> list[str]:
    return [(out / f).read_text() for f in ("trials.csv", "cells.csv", "importance.csv", "survival.csv")]


def _table_run(root: Path):
    mlc = client(f"sqlite:///{root / 'workdir' / 'mlflow.db'}")
    exp = mlc.get_experiment_by_name(GRID)
    (run,) = mlc.search_runs([exp.experiment_id], filter_string=f"tags.`{summary_table.SHA_TAG}` != ''")
    art = Path(mlc.download_artifacts(run.info.run_id, "summaries", str(root / "dl")))
    # the file the store holds (a local artifact store: download_artifacts copies it)
    held = next((root / "workdir").rglob(summary_table.ARTIFACT_NAME))
    assert held.read_bytes() == (art / summary_table.ARTIFACT_NAME).read_bytes()
    return mlc, run, held


def test_a_compare_without_the_workdir_reads_the_table_not_the_histories(
        recorded: Path, monkeypatch, capsys) -> None:
    local, fetched = _compare(recorded, "out-local", monkeypatch, workdir=True)
    assert fetched == []  # the workdir's summaries
    elsewhere, fetched = _compare(recorded, "out-table", monkeypatch, workdir=False)
    assert fetched == []  # no metric history was asked for: every entry agreed
    assert _tables(elsewhere) == _tables(local)
    assert "warning" not in capsys.readouterr().err
    for png in local.glob("*.png"):
        assert (elsewhere / png.name).read_bytes() == png.read_bytes(), png.name


def test_a_trial_whose_run_changed_since_is_read_from_mlflow(recorded: Path, monkeypatch) -> None:
    mlc, _, _ = _table_run(recorded)
    exp = mlc.get_experiment_by_name(GRID)
    trial = mlc.search_runs([exp.experiment_id], filter_string="tags.trial_id != ''", max_results=1)[0]
    key = "summary.peak.critic/score/mean"
    old = trial.data.tags[key]
    mlc.set_tag(trial.info.run_id, key, repr(float(old) + 1.0))  # as if resumed and logged anew
    try:
        _, fetched = _compare(recorded, "out-changed", monkeypatch, workdir=False)
        assert fetched == [[trial.info.run_id]]
    finally:
        mlc.set_tag(trial.info.run_id, key, old)


def test_a_damaged_or_foreign_table_is_ignored_with_one_warning(recorded: Path, monkeypatch,
                                                                capsys) -> None:
    local, _ = _compare(recorded, "out-local", monkeypatch, workdir=True)
    mlc, run, held = _table_run(recorded)
    good = held.read_bytes()
    other = summary_table.encode("another-grid", summary_table.decode(good, GRID))
    try:
        for data, sha, why in ((good[:-100], None, "its bytes are not those its run's tag records"),
                               (other, hashlib.sha256(other).hexdigest(), "the table of grid 'another-grid'")):
            held.write_bytes(data)
            if sha:
                mlc.set_tag(run.info.run_id, summary_table.SHA_TAG, sha)
            capsys.readouterr()
            out, fetched = _compare(recorded, "out-damaged", monkeypatch, workdir=False)
            lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning")]
            assert len(lines) == 1 and why in lines[0] and "read from MLflow instead" in lines[0], lines
            assert len(fetched) == 1 and len(fetched[0]) == 20  # every trial from its history
            assert _tables(out) == _tables(local)
    finally:
        held.write_bytes(good)
        mlc.set_tag(run.info.run_id, summary_table.SHA_TAG, hashlib.sha256(good).hexdigest())
