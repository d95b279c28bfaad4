"""``ablate compare`` on a grid that a real submission is still running: it compares the trials
that have finished and says how many are still running; once none has finished it says so.

One ``ablate submit`` of the real simulator (three trials one at a time) runs as a subprocess
while ``ablate compare`` is run beside it, as a user would from a second terminal.
"""
from __future__ import annotations

import csv
import re
import time
from pathlib import Path

import cliproc
import pytest

from orchestrator.store import TrialPaths, records

# 800 steps: the two trials after the first outlast a compare's start on a loaded 2-core host
# (at 150 steps, about 10 s a trial, both had finished before the mid-run compare read the grid;
# at 400, about 10 s a trial on a quiet host, so had they once in a suite run at load 15).
GRID = """\
name: running
recipe: sim/grpo_tiny
backend: sim
steps: 800
seeds: [0]
axes:
  correction.is_level: [none, token, sequence]
  pool: [sim-h100]
checkpoint: {every: 200}
budget: {max_parallel: 1}
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  train.minibatches: 1
  eval.every: 10
  eval.prompts: 16
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
"""


def _states(grid_dir: Path) -> dict[str, records.TrialRecord]:
    return {tid: records.load_state(TrialPaths(grid_dir, tid), tid)
            for tid in records.trial_ids(grid_dir)}


def _log(grid_dir: Path) -> str:
    return (grid_dir.parent.parent / "ablate.log").read_text()[-3000:]


def _wait(grid_dir: Path, proc, what: str, cond, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = _states(grid_dir)
        if cond(states):
            return states
        assert proc.poll() is None, f"submit ended before {what}: {_log(grid_dir)}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {states}")


@pytest.mark.slow
def test_compare_while_the_grid_runs(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_text(GRID)
    grid_dir = tmp_path / ".ablate" / "running"
    out = tmp_path / "results"
    with cliproc.ablate_env(tmp_path) as env:
        submit = cliproc.start(["submit", "g.yaml", "--quiet"], env, tmp_path)
        try:
            def state_of(states, value):
                return [t for t in states.values() if t.state.value == value]

            # Nothing finished yet (the first trial runs): compare says so and writes nothing.
            _wait(grid_dir, submit, "the first trial to start",
                  lambda s: len(s) == 3 and state_of(s, "running"))
            early = cliproc.run(["compare", "g.yaml", "--out", str(out)], env, tmp_path)
            if not state_of(_states(grid_dir), "done"):  # still none after compare returned
                assert early.returncode == 2, early.stdout + early.stderr
                assert ("error: grid 'running': no trial has finished yet; 3 trials still "
                        "running (1 running, 2 queued)") in early.stderr
                assert not (out / "summary.md").exists()
            # One finished and sent to MLflow, the others running or queued: a partial comparison.
            _wait(grid_dir, submit, "a finished trial in MLflow",
                  lambda s: any(t.state.value == "done" and t.mlflow_run_id for t in s.values()))
            mid = cliproc.run(["compare", "g.yaml", "--out", str(out)], env, tmp_path)
            assert mid.returncode == 0, mid.stdout + mid.stderr
            # A trial that ended a moment ago may not be in MLflow yet: it is counted as such.
            m = re.search(r"compared the (\d+) finished trials?; (\d+) trials? still running "
                          r"\((\d+) running, (\d+) queued(?:, (\d+) finished but not in MLflow "
                          r"yet)?\): run `ablate compare` again", mid.stdout)
            assert m, mid.stdout
            finished, unfinished, running, queued, unsent = (int(g or 0) for g in m.groups())
            assert finished >= 1 and finished + unfinished == 3
            assert running + queued + unsent == unfinished
            assert unfinished >= 1
            with (out / "trials.csv").open() as f:
                rows = list(csv.DictReader(f))
            assert len(rows) == finished and all(r["verdict"] for r in rows)
            assert re.search(rf"\*\*Partial: {unfinished} trials? still running \({running} running",
                             (out / "summary.md").read_text())
            assert "Partial:" in (out / "summary.html").read_text()
            assert submit.wait(timeout=400) == 0, _log(grid_dir)
        finally:
            cliproc.stop(submit)
        # All finished: a whole comparison, no partial note.
        end = cliproc.run(["compare", "g.yaml", "--out", str(out)], env, tmp_path)
    assert end.returncode == 0, end.stdout + end.stderr
    assert "still running" not in end.stdout
    with (out / "trials.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3
    assert "Partial" not in (out / "summary.md").read_text()
