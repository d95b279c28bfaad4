"""How ``ablate submit`` ends when not every trial did (#59 items 3 and 9): the real CLI in a
subprocess with the double backend. Ctrl-C during it (SIGINT to its process group, as a
terminal sends it) exits non-zero and says what its trials got to, instead of Ray Tune's handler
ending the fit as if it had finished (exit 0, ``not run <id>: None`` for a trial that ran); a
trial that failed for good makes it exit 1.
"""
from __future__ import annotations

import time
from pathlib import Path

import cliproc
import pytest
from relhelpers import one_trial_grid, total_steps

from orchestrator.store import TrialPaths, records, workspace


@pytest.mark.slow  # a real `ablate submit` on a local Ray: ~25-60 s on 2 cores
def test_ctrl_c_during_submit_exits_non_zero_and_says_what_ran(isolated: Path) -> None:
    grid = one_trial_grid(isolated / "g.yaml", "intr", steps=400)
    grid_dir = workspace.grid_dir("intr")
    with cliproc.ablate_env(isolated, {"ABLATE_DOUBLE_STEP_S": "0.05"}) as env:
        proc = cliproc.start(["submit", str(grid)], env, isolated, double=True)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None and total_steps(grid_dir) < 3:
                time.sleep(0.2)
            assert proc.poll() is None, (isolated / "ablate.log").read_text()[-3000:]
        finally:
            cliproc.stop(proc)
    out = (isolated / "ablate.log").read_text()
    (tid,) = [p.name for p in (grid_dir / "trials").iterdir()]
    assert proc.returncode == 130, out[-3000:]
    said = out.split("interrupted; the trials so far", 1)[-1]
    assert f"unfinished {tid} (sim-h100) at step " in said and "None" not in said, out[-3000:]
    assert not records.load_state(TrialPaths(grid_dir, tid), tid).state.is_finished()
    assert total_steps(grid_dir) >= 3


@pytest.mark.slow  # a real `ablate submit` on a local Ray: ~25-60 s on 2 cores
def test_a_submit_whose_trial_failed_for_good_exits_non_zero(isolated: Path) -> None:
    """Every attempt raises at step 7 (the double's ``train.lr: 0.0666``) and the retry is
    spent: the trial ends failed as infra, and ``ablate submit`` says so and exits 1, not 0."""
    grid = isolated / "g.yaml"
    grid.write_text("name: bad\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 10\nseeds: [0]\n"
                    "axes:\n  pool: [sim-h100]\noverrides: {train.lr: 0.0666}\nretries: {max: 1}\n")
    with cliproc.ablate_env(isolated, {"ABLATE_DOUBLE_STEP_S": "0.001"}) as env:
        proc = cliproc.run(["submit", str(grid)], env, isolated, double=True)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "failed 1" in proc.stdout and "retries exhausted after 2 attempts" in proc.stdout
