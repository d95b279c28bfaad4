"""Faults on a real multi-raylet Ray cluster with the real runner, scheduler and MLflow (SQLite):
a corrupt state file, a full disk while a checkpoint is written, and concurrency (two ``ablate
submit`` at the same time, ``ablate resume`` and ``ablate status`` while the grid runs).

The backend is the deterministic double of ``tests/doubles.py`` (or its fault-injecting variant
in ``relbackends.py``): exact steps, state in its checkpoint, so "nothing lost or duplicated" is
checked value by value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import relhelpers as H

from orchestrator import scheduler
from orchestrator.cli import main
from orchestrator.exceptions import DiskFullError
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.store import MANIFEST, CheckpointStore, TrialPaths, records

pytestmark = pytest.mark.usefixtures("double")


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    return lines[0]


# --------------------------------------------------------------------------- corrupt state file


@pytest.mark.slow
def test_corrupt_state_files_give_one_line_with_the_fix_and_the_fix_loses_nothing(
    isolated: Path, cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c, _nodes = cluster
    path = H.write_grid(
        isolated / "g.yaml",
        "corrupt",
        steps=10,
        seeds=[0],
        levels=["token"],
        pools=["sim-h100", "sim-a100"],
        tiny=False,
    )
    grid = load_grid(path)
    done, broken = expand(grid)
    grid_dir = isolated / ".ablate" / "corrupt"
    run_single(str(path), done.trial_id)  # finished: steps 1-10, checkpoints 5 and 10
    monkeypatch.setenv("ABLATE_DOUBLE_FAIL_ONCE", str(isolated))
    with pytest.raises(RuntimeError, match="injected"):
        run_single(str(path), broken.trial_id)  # interrupted at step 7: pending, checkpoint 5
    monkeypatch.delenv("ABLATE_DOUBLE_FAIL_ONCE")
    run_ids = {
        t: records.load_state(TrialPaths(grid_dir, t), t).mlflow_run_id
        for t in (done.trial_id, broken.trial_id)
    }
    damaged = {
        TrialPaths(grid_dir, done.trial_id).state: "truncated",
        TrialPaths(grid_dir, broken.trial_id).state: "garbage",
    }
    for f, how in damaged.items():
        data = f.read_bytes()
        f.write_bytes(
            data[: len(data) // 2] if how == "truncated" else b"\x00\xff{{garbage" + data[:7]
        )
    attempts_before = {
        t: len(records.load_attempts(TrialPaths(grid_dir, t)))
        for t in (done.trial_id, broken.trial_id)
    }
    capsys.readouterr()

    # status shows the grid and names each damaged trial's file with its fix (a warning each:
    # one trial's damage is not the grid's).
    assert main(["status", "corrupt"]) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == len(damaged), warnings
    for f in damaged:
        (line,) = [ln for ln in warnings if f"{f}: corrupt JSON state file" in ln]
        assert "fix: delete it and submit the grid again" in line
    # Follow the fix, one named file at a time: each submit either refuses before anything
    # starts (one line naming the next file) or runs the grid.
    fixed = []
    for _ in range(len(damaged) + 1):
        rc = main(["submit", str(path), "--address", c.address, "--no-progress"])
        if rc == 0:
            break
        assert rc == 2
        line = _one_line_error(capsys)
        named = next(f for f in damaged if line.startswith(f"error: {f}: corrupt JSON state file"))
        assert {
            t: len(records.load_attempts(TrialPaths(grid_dir, t))) for t in attempts_before
        } == attempts_before  # nothing started
        named.unlink()
        fixed.append(named)
    assert rc == 0 and sorted(fixed) == sorted(damaged)
    uri = f"sqlite:///{isolated / '.ablate' / 'mlflow.db'}"
    H.check_exactly_once(
        grid_dir,
        uri,
        steps=10,
        keys=("critic/score/mean", "acc"),
        reopened=frozenset({done.trial_id}),
    )
    for tid, run_id in run_ids.items():  # the same MLflow run, found again through the outbox
        assert records.load_state(TrialPaths(grid_dir, tid), tid).mlflow_run_id == run_id
    b = records.load_attempts(TrialPaths(grid_dir, broken.trial_id))
    assert [(a.outcome, a.resumed_from_step) for a in b] == [
        ("infra_failure", None),
        ("completed", 5),
    ]
    # The finished trial was rebuilt as pending and resumed from its last checkpoint (step 10,
    # its end): nothing re-ran, and its one completed attempt was finished again, not doubled.
    a = records.load_attempts(TrialPaths(grid_dir, done.trial_id))
    assert [(x.outcome, x.start_step, x.end_step) for x in a] == [("completed", 1, 10)]
    assert main(["status", "corrupt"]) == 0


@pytest.mark.slow
def test_corrupt_attempts_file_of_an_unfinished_trial_is_named_with_its_fix(
    isolated: Path, cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c, _nodes = cluster
    path = H.write_grid(
        isolated / "g.yaml",
        "corrupt2",
        steps=10,
        seeds=[0],
        levels=["token"],
        pools=["sim-h100"],
        tiny=False,
        retries=1,
    )
    (broken,) = expand(load_grid(path))
    grid_dir = isolated / ".ablate" / "corrupt2"
    monkeypatch.setenv("ABLATE_DOUBLE_FAIL_ONCE", str(isolated))
    with pytest.raises(RuntimeError, match="injected"):
        run_single(str(path), broken.trial_id)  # interrupted at step 7: pending, checkpoint 5
    monkeypatch.delenv("ABLATE_DOUBLE_FAIL_ONCE")
    attempts = TrialPaths(grid_dir, broken.trial_id).attempts
    attempts.write_text(attempts.read_text()[:40])
    capsys.readouterr()
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 2
    _out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if " INFO " not in line]  # mlflow's logging
    assert len(lines) == 1 and "Traceback" not in err, err  # found before Tune starts a worker
    assert lines[0].startswith(f"error: {attempts}: corrupt JSON state file") and "fix: delete it" in lines[0]
    attempts.unlink()  # the fix the message names
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 0
    uri = f"sqlite:///{isolated / '.ablate' / 'mlflow.db'}"
    H.check_exactly_once(grid_dir, uri, steps=10, keys=("critic/score/mean", "acc"))
    final = records.load_attempts(TrialPaths(grid_dir, broken.trial_id))[-1]
    assert (final.outcome, final.resumed_from_step) == ("completed", 5)


# --------------------------------------------------------------------------- full disk


@pytest.mark.slow
def test_full_disk_during_a_checkpoint_stops_the_submission_and_the_next_resumes_from_the_last_good_one(
    isolated: Path, cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import backends

    c, _nodes = cluster
    monkeypatch.setitem(backends._TRAINERS, "sim", ("relbackends", "DiskFullTrainer"))
    path = H.write_grid(
        isolated / "g.yaml",
        "diskfull",
        steps=20,
        seeds=[0],
        levels=["token"],
        pools=["sim-h100", "sim-a100"],
        tiny=False,
        keep=10,  # step 5 stays to be checked
    )
    # Each trial's disk fills once: the submission that meets it stops (not retried onto the
    # same full disk) with one line; the next one goes on.
    stops = []
    for _ in range(3):
        try:
            summary = scheduler.submit(str(path), address=c.address, progress=False)
            break
        except DiskFullError as exc:
            stops.append(str(exc))
    assert 1 <= len(stops) <= 2, stops
    assert all("No space left on device" in m and "fix: free space" in m for m in stops), stops
    assert summary["states"] == {"done": 2} and summary["verdicts"] == {"healthy": 2}, summary
    grid_dir = Path(summary["grid_dir"])
    H.check_exactly_once(
        grid_dir, summary["tracking_uri"], steps=20, keys=("critic/score/mean", "acc")
    )
    for tid, t in H.trials(grid_dir).items():
        assert (t["paths"].root / "enospc").read_text() == "10"  # the fault did fire
        *stopped, first, second = t["attempts"]
        # (an attempt the first stop interrupted on the other pool ends as an infra failure too)
        assert all(a.outcome == "infra_failure" for a in stopped), stopped
        assert (first.outcome, first.end_step) == ("infra_failure", 10)
        assert "OSError" in first.reason and "No space left on device" in first.reason
        assert (second.outcome, second.resumed_from_step, second.start_step) == ("completed", 5, 6)
        store = CheckpointStore(t["paths"].checkpoints, trial_id=tid, keep=10)
        assert store.steps() == [5, 10, 15, 20] and all(
            store.verify(s) is None for s in store.steps()
        )
        # The good checkpoint of step 5 was neither touched by the failed save nor rewritten.
        made = json.loads((t["paths"].checkpoints / "step-00000005" / MANIFEST).read_text())
        assert made["created_at"] < second.started_at
        assert not list(t["paths"].checkpoints.glob(".step-*"))  # the half-written save is gone
        # MLflow has the failure too: attempt tags, and the reason in the attempts artifact.
        from mlflow.tracking import MlflowClient

        mlc = MlflowClient(summary["tracking_uri"])
        run_id = t["state"].mlflow_run_id
        tags = mlc.get_run(run_id).data.tags
        assert (tags["attempt.1.outcome"], tags["attempt.1.steps"]) == ("infra_failure", "1-10")
        art = mlc.download_artifacts(run_id, "attempts.json", str(isolated / "dl" / tid))
        assert (
            "No space left on device" in json.loads(Path(art).read_text())["attempts"][0]["reason"]
        )


# --------------------------------------------------------------------------- concurrency

DRIVER = """\
import sys
from orchestrator import backends
from orchestrator.cli import main
backends._TRAINERS["sim"] = ("relbackends", "PacedDouble")
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_two_submits_at_once_run_each_trial_once_and_resume_while_running_is_refused(
    isolated: Path, cluster
) -> None:
    c, _nodes = cluster
    path = H.write_grid(
        isolated / "g.yaml",
        "race",
        steps=30,
        seeds=[0],
        levels=["token", "sequence"],
        pools=["sim-h100", "sim-a100"],
        budget="{max_parallel: 4}",
        tiny=False,
    )
    grid_dir = isolated / ".ablate" / "race"
    driver = isolated / "driver.py"
    driver.write_text(DRIVER)
    grid_dir.mkdir(parents=True)
    (grid_dir / "double_step_s").write_text("0.3")  # 9 s a trial: long enough to meet it
    env = dict(os.environ)

    def cli(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(driver), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    submits = [cli("submit", str(path), "--address", c.address, "--no-progress") for _ in range(2)]
    try:
        deadline = time.time() + 120
        while time.time() < deadline and H.total_steps(grid_dir) < 3:
            time.sleep(0.1)
        assert H.total_steps(grid_dir) >= 3, "the grid never started"
        # While it runs: resume is refused (one line, names the holder); status answers.
        resume = subprocess.run(
            [sys.executable, str(driver), "resume", str(path), "--failed", "--pool", "sim-h100"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        status = subprocess.run(
            [sys.executable, str(driver), "status", "race", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        running_during = H.total_steps(grid_dir) < 4 * 30
        outs = [p.communicate(timeout=240) + (p.returncode,) for p in submits]
    finally:
        for p in submits:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert running_during
    assert resume.returncode == 2, resume.stderr
    assert resume.stderr.count("\n") == 1 and "Traceback" not in resume.stderr
    assert "grid race is already being run by pid" in resume.stderr
    assert status.returncode == 0 and json.loads(status.stdout)["orchestrator"], status.stderr
    codes = sorted(rc for _out, _err, rc in outs)
    assert codes == [0, 2], outs
    loser_err = next(err for _out, err, rc in outs if rc == 2)
    assert loser_err.count("\n") == 1 and "already being run by pid" in loser_err, loser_err
    uri = f"sqlite:///{isolated / '.ablate' / 'mlflow.db'}"
    H.check_exactly_once(grid_dir, uri, steps=30, keys=("critic/score/mean", "acc"))
    for tid, t in H.trials(grid_dir).items():
        assert len(t["attempts"]) == 1, (tid, t["attempts"])  # nobody ran a trial twice
    # One parent run: the refused submit created nothing in MLflow either.
    from mlflow.tracking import MlflowClient

    mlc = MlflowClient(uri)
    exp = mlc.get_experiment_by_name("race")
    parents = mlc.search_runs([exp.experiment_id], "tags.`ablate.role` = 'grid'")
    assert len(parents) == 1
