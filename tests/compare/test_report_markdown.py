"""Labels a user chose (bundle names, axis values, pools, reasons) reach ``summary.md`` and the
parent run's ``mlflow.note.content`` (rendered as Markdown by the MLflow UI) as text, never as
markup."""
from __future__ import annotations

from pathlib import Path

from orchestrator import metrics as M
from orchestrator.compare._data import Segment, TrialResult
from orchestrator.compare._report import build_report

LABEL = "<img src=x onerror=alert(1)>"
LINK = "[x](javascript:alert(1)) | cell"


def _result(i: int, engine: str) -> TrialResult:
    curve = [(s, 0.1 * s + 0.01 * i) for s in range(1, 6)]
    return TrialResult(
        trial_id=f"t{i:012x}", run_id=f"{i:032x}", axes={"engine": engine}, seed=i % 2,
        pool="sim-h100", status="done", verdict="healthy", verdict_step=None,
        verdict_reason=f"reason <b>{i}</b>", derived_from=None,
        curves={M.TRAIN_REWARD: curve, M.K3_KL: [(s, 1e-3) for s in range(1, 6)],
                M.GRAD_NORM: [(s, 1.0) for s in range(1, 6)]},
        latest={}, segments=[Segment(1, "sim-h100", 1, 5)])


def test_labels_are_escaped_in_summary_md(tmp_path: Path) -> None:
    results = [_result(i, LABEL if i < 2 else LINK) for i in range(4)]
    build_report(results, ["engine"], None, None, tmp_path, grid_name="esc",
                 store="sqlite:///x`y<z>.db")
    text = (tmp_path / "summary.md").read_text()
    assert "<img" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "\\[x\\](javascript:alert(1)) \\| cell" in text and "[x](" not in text
    assert "``sqlite:///x`y&lt;z&gt;.db``" not in text and "``sqlite:///x`y<z>.db``" in text
    # The table keeps its shape: every row of the pivot has as many cells as its header.
    lines = text.splitlines()
    start = lines.index("| engine | all |")
    rows = lines[start + 2:start + 4]
    assert [r.count(" | ") for r in rows] == [1, 1], rows
    assert all("<br>" in r for r in rows)  # the tool's own markup in the cells stays
    html = (tmp_path / "summary.html").read_text()
    assert "<img src=x" not in html


def test_parent_run_note_is_the_escaped_summary(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from orchestrator.compare._parent import log_to_parent
    from orchestrator.tracking import ROLE_TAG

    results = [_result(i, LABEL) for i in range(2)]
    out = tmp_path / "results"
    out.mkdir()
    build_report(results, ["engine"], None, None, out, grid_name="esc", store="s")
    mlc = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = mlc.create_experiment("esc", artifact_location=(tmp_path / "artifacts").as_uri())
    run = mlc.create_run(exp, tags={ROLE_TAG: "grid"})
    log_to_parent(mlc, exp, out, "esc", {}, "d1")
    note = mlc.get_run(run.info.run_id).data.tags["mlflow.note.content"]
    assert note.startswith("# Grid `esc`: comparison")
    assert "&lt;img src=x onerror=alert(1)&gt;" in note and "<img" not in note
