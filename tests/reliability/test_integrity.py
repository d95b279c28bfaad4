"""A damaged ``metrics.jsonl`` or ``attempts.json`` of a finished trial is found wherever it is
read: ``ablate status`` says which file and what it lacks (never a silent ``done 15/30``), a
corrupt ``attempts.json`` is one line naming it and the fix, and ``ablate submit`` repairs the
metrics file (a torn line dropped; missing steps from MLflow, or recomputed from a checkpoint).

The first tests write the files by hand (no Ray); the last runs a grid on the suite's cluster.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import relhelpers as H

from orchestrator.cli import main
from orchestrator.store import TrialPaths, records
from orchestrator.trial import Attempt, TrialState


def _rows(n: int) -> list[tuple[int, dict[str, float]]]:
    return [(s, {"critic/score/mean": s / 100, "actor/grad_norm": 1.0 + s}) for s in range(1, n + 1)]


@pytest.fixture
def finished(isolated: Path) -> TrialPaths:
    """A trial that finished 30 steps, written by hand."""
    t, paths = H.saved_trial(isolated, "shapes", steps=30)
    records.write_metrics(paths.metrics, _rows(30))
    records.save_attempts(paths, [Attempt(number=1, pool="sim-h100", start_step=1, end_step=30,
                                          outcome="completed")])
    records.save_state(paths, records.TrialRecord(
        trial_id=t.trial_id, state=TrialState.DONE, pool="sim-h100", attempts=1, last_step=30,
        committed_step=30, verdict={"kind": "healthy", "step": 30, "reason": ""}))
    return paths


def _cut_mid_line(path: Path, step: int) -> None:
    """Cut the file in the middle of the line of ``step`` (as a copy or a full disk does)."""
    data = path.read_bytes()
    start = data.index(b'{"step":%d,' % step)
    path.write_bytes(data[: start + 12])


def test_check_metrics_tells_a_torn_line_and_missing_steps(finished: TrialPaths) -> None:
    assert records.check_metrics(finished.metrics, 30).ok
    _cut_mid_line(finished.metrics, 16)
    check = records.check_metrics(finished.metrics, 30)
    assert (check.torn, check.good_through, check.missing) == (True, 15, 15)
    assert "holds steps 1-15 of the 30" in check.describe()
    assert records.repair_torn(finished.metrics) == 15
    check = records.check_metrics(finished.metrics, 30)
    assert (check.torn, check.good_through, check.missing) == (False, 15, 15)
    # A lost line in the middle is a gap, not a shorter run.
    rows = _rows(30)
    records.write_metrics(finished.metrics, rows[:9] + rows[10:])
    assert records.check_metrics(finished.metrics, 30).good_through == 9


def test_status_never_shows_a_short_finished_trial_silently(
    finished: TrialPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    _cut_mid_line(finished.metrics, 16)
    capsys.readouterr()
    assert main(["status", "shapes"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (line,) = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert f"{finished.metrics}: 1 torn or unreadable line(s) and holds steps 1-15 of the 30" in line
    assert "fix: `ablate submit` the grid again" in line
    assert main(["status", "shapes", "--json"]) == 0
    (trial,) = json.loads(capsys.readouterr().out)["trials"]
    assert trial["state"] == "done" and "holds steps 1-15 of the 30" in trial["problem"]
    # status only reports: the file is as it was
    assert records.check_metrics(finished.metrics, 30).torn


@pytest.mark.parametrize("cut", [0, 40, -2])
def test_corrupt_attempts_file_of_a_finished_trial_is_one_line_with_the_fix(
    finished: TrialPaths, capsys: pytest.CaptureFixture[str], cut: int
) -> None:
    text = finished.attempts.read_text()
    finished.attempts.write_text(text[:cut])
    capsys.readouterr()
    assert main(["status", "shapes"]) == 0  # the trial is shown as unreadable, not the grid
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in out + err, err
    assert err.startswith(f"warning: trial {finished.root.name}: {finished.attempts}: corrupt JSON "
                          "state file (")
    assert "fix: delete it and submit the grid again" in err


# --------------------------------------------------------------------------- submit repairs


def _drop_mlflow_steps_after(uri: str, run_id: str, step: int) -> None:
    """MLflow lost the run's later steps (a store restored from an older backup)."""
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as db:
        db.execute("DELETE FROM metrics WHERE run_uuid = ? AND step > ?", (run_id, step))


@pytest.mark.slow
@pytest.mark.usefixtures("double")
def test_submit_repairs_short_metrics_from_mlflow_or_by_resuming_from_a_checkpoint(
    isolated: Path, cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import scheduler

    c, _nodes = cluster
    path = H.write_grid(isolated / "g.yaml", "torn", steps=20, seeds=[0], levels=["token"],
                        pools=["sim-h100", "sim-a100"], tiny=False)
    path.write_text(path.read_text().replace("keep: 2", "keep: 10"))
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    assert summary["states"] == {"done": 2}, summary
    grid_dir, uri = Path(summary["grid_dir"]), summary["tracking_uri"]
    before = {tid: list(records.iter_metrics(t["paths"].metrics))
              for tid, t in H.trials(grid_dir).items()}
    a, b = sorted(before)
    run_a = records.load_state(TrialPaths(grid_dir, a), a).mlflow_run_id
    run_b = records.load_state(TrialPaths(grid_dir, b), b).mlflow_run_id
    for tid in (a, b):
        _cut_mid_line(TrialPaths(grid_dir, tid).metrics, 12)
    _drop_mlflow_steps_after(uri, run_b, 9)
    capsys.readouterr()

    # compare (its tables come from MLflow) says which trial's own record is damaged
    assert main(["compare", str(path), "--out", str(isolated / "results")]) == 0
    warned = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning: ")]
    assert len(warned) == 2 and all("holds steps 1-11 of the 20" in x for x in warned), warned
    # resume past the hole MLflow cannot fill is refused; nothing ran
    assert main(["resume", str(path), "--trial", b, "--pool", "sim-h100", "--from", "15",
                 "--address", c.address]) == 2
    err = capsys.readouterr().err
    refused = [x for x in err.splitlines() if x.startswith("error: ")]
    assert refused and refused[0].startswith(f"error: trial {b}: cannot resume from step 15: "), err
    assert "fix: `--from` a checkpoint at or before step 11" in refused[0]
    assert len(H.trials(grid_dir)[b]["attempts"]) == 1

    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 0
    _out, err = capsys.readouterr()
    said = [line for line in err.splitlines() if line.startswith("repaired: ")]
    assert len(said) == 2 and "Traceback" not in err, err
    line_a = next(x for x in said if a in x)
    assert "holds steps 1-11 of the 20" in line_a and f"restored steps 12-20 from MLflow run {run_a}" in line_a
    line_b = next(x for x in said if b in x)
    assert "resuming it from its checkpoint of step 10" in line_b

    after = H.trials(grid_dir)
    for tid in (a, b):  # the same rows, value for value, and a sound file
        assert list(records.iter_metrics(after[tid]["paths"].metrics)) == before[tid]
        assert records.check_metrics(after[tid]["paths"].metrics, 20).ok
        assert after[tid]["state"].state is TrialState.DONE
    # A: nothing ran again. B: one attempt recomputed steps 11-20 from checkpoint 10.
    assert [(x.outcome, x.start_step) for x in after[a]["attempts"]] == [("completed", 1)]
    assert [(x.outcome, x.start_step, x.resumed_from_step) for x in after[b]["attempts"]] == [
        ("completed", 1, None), ("completed", 11, 10)]
    for tid in (a, b):  # MLflow: one live run per trial holding steps 1..20 once each
        (run,) = H.live_runs(uri, tid)
        assert run.info.run_id == after[tid]["state"].mlflow_run_id
        for key in ("critic/score/mean", "acc"):
            assert H.mlflow_steps(uri, run.info.run_id, key) == list(range(1, 21)), (tid, key)
    assert after[a]["state"].mlflow_run_id == run_a
    assert main(["status", "torn"]) == 0
    assert "warning" not in capsys.readouterr().err

    # A corrupt attempts.json of the finished trial: named with its fix; the fix loses nothing.
    attempts = after[b]["paths"].attempts
    attempts.write_text(attempts.read_text()[:50])
    assert main(["status", "torn"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: trial {b}: {attempts}: corrupt JSON state file") and "fix: delete it" in err
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {attempts}: corrupt JSON state file")
    attempts.unlink()
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("repaired: ")]
    run_b = after[b]["state"].mlflow_run_id
    assert said == [f"repaired: trial {b}: {attempts} was missing; restored its 2 attempt(s) "
                    + f"from MLflow run {run_b}"]
    assert records.load_attempts(after[b]["paths"]) == after[b]["attempts"]
