"""A rescue policy's bounds over a trial's lineage (#59 item 1): ``times`` counts the rescues
of a trial and of every trial derived from it, and a derived trial does not act on the warning
it inherited from its parent's steps.

The k3 warning of ``warnrescue`` (onset step 3 on sim-a100, 12 steps); the rescue's setting
(``train.grad_clip``) leaves k3 where it was, so without a bound over the lineage every derived
trial warns again and is rescued again under a new id. Each attempt runs in this process, as a
Ray worker runs it, without tracking.
"""
from __future__ import annotations

from pathlib import Path

from warnrescue import SECTIONS

from orchestrator.grid import expand, load_grid
from orchestrator.run import make_job, run_attempt
from orchestrator.scheduler._rescue import auto_rescue
from orchestrator.store import TrialPaths, records, workspace

_USELESS = ("rescue:\n  - {when: {warning: k3_warn}, of_rescues: true, times: 2, "
            "resume: {set: {train.grad_clip: 0.9}}}\n")


def _chain(isolated: Path, every: int, rounds: int = 6) -> tuple[list[str], Path]:
    """The parent run, then rescue after rescue (each run) until none is made or ``rounds``."""
    path = isolated / "chain.yaml"
    path.write_text("name: chain\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 6\nseeds: [0]\n"
                    f"axes:\n  pool: [sim-a100]\ncheckpoint: {{every: {every}, keep: 6}}\n"
                    + SECTIONS + _USELESS)
    grid = load_grid(path)
    (trial,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    ran = [trial.trial_id]
    for _ in range(rounds):
        run_attempt(make_job(grid, trial, grid_dir=grid_dir, tracking=None, submission="test"))
        made = auto_rescue(grid, grid_dir, ran)
        if not made:
            break
        (trial,) = made
        ran.append(trial.trial_id)
    return ran, grid_dir


def test_times_bounds_the_rescues_of_a_whole_lineage(isolated: Path) -> None:
    """Each derived trial warns again at its own step 3 (it starts from step 2): two rescues
    over the lineage (``times: 2``), not one per derived trial without end."""
    ran, grid_dir = _chain(isolated, every=2)
    assert len(ran) == 3  # the parent and two rescues
    last = records.load_state(TrialPaths(grid_dir, ran[-1]), ran[-1])
    assert last.rescue_of["parent"] == ran[1] and not last.rescues
    assert [n["entry"] for n in last.rescue_of["lineage"]] == [0, 0]


def test_a_derived_trial_does_not_stop_on_the_warning_it_inherited(isolated: Path) -> None:
    """With a checkpoint at the warning's onset, the rescue starts there and inherits the
    warning's steps: it runs on to its last step instead of stopping and being rescued again
    at the same step."""
    ran, grid_dir = _chain(isolated, every=1)
    assert len(ran) == 2
    child = records.load_state(TrialPaths(grid_dir, ran[1]), ran[1])
    assert child.rescue_of["step"] == 3 and child.last_step == 6
    assert "rescued_step" not in (child.verdict or {})
