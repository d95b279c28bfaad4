"""Ctrl-C during ``ablate submit`` (#59 item 9): the submission exits non-zero and says what
its trials got to, instead of Ray Tune's handler ending the fit as if it had finished (exit 0,
``not run <id>: None`` for a trial that ran). The real CLI in a subprocess with the double
backend (one slow trial), interrupted as a terminal's Ctrl-C does (SIGINT to its process group).
"""
from __future__ import annotations

import time
from pathlib import Path

import cliproc
from relhelpers import one_trial_grid, total_steps

from orchestrator.store import TrialPaths, records, workspace


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
