"""What a grid's records say about its rescues after the fact (#59 items 6 and 9)."""
from __future__ import annotations

import csv
from pathlib import Path

from orchestrator import metrics as M
from orchestrator.compare._data import Segment, TrialResult
from orchestrator.compare._rescues import rescue_section


def test_an_in_place_infra_rescue_gains_at_the_parents_last_step(tmp_path: Path) -> None:
    """A trial whose attempt on sim-h100 failed for the infrastructure at step 20, resumed in
    place from checkpoint 15 on sim-a100 and run to step 120: its gain is its reward at step 20
    against the failed attempt's (like with like), not its step 120 against the failure's 20."""
    ours = [(s, 0.01 * s) for s in range(1, 121)]  # the rescue's own curve (steps 1-15 inherited)
    failed_tail = [(s, 0.01 * s - 0.02) for s in range(16, 21)]  # what the failed attempt logged
    r = TrialResult(trial_id="t1", run_id="r1", axes={"pool": "sim-h100"}, seed=0, pool="sim-h100",
                    status="FINISHED", verdict="healthy", verdict_step=None, verdict_reason="",
                    derived_from=None, curves={M.TRAIN_REWARD: ours}, latest={},
                    segments=[Segment(1, "sim-h100", 1, 20), Segment(2, "sim-a100", 16, None)],
                    superseded=[{M.TRAIN_REWARD: failed_tail}],
                    rescue={"of": "t1", "event": "infra_failed", "from_step": "15"})
    section = rescue_section([r], tmp_path)
    (cell,) = section["rows"]
    assert abs(cell["gain_final"].estimate - 0.02) < 1e-9  # 0.20 against 0.18, both at step 20
    with open(tmp_path / "rescues.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["final"]) == 1.2 and abs(float(row["parent final"]) - 0.18) < 1e-9


def test_a_garbage_metrics_line_is_no_step(tmp_path: Path) -> None:
    """A stray row (``{"step": 9999999}``) after step 5 is not the trial's step in ``ablate
    status`` (``last_metrics``), counts as a bad line for the check and goes in the repair;
    rows after a lost one that continue each other stay (the lost step shows as missing)."""
    from orchestrator.store import records

    path = tmp_path / "metrics.jsonl"
    records.write_metrics(path, [(s, {"x": float(s)}) for s in range(1, 6)])
    with open(path, "a") as fh:
        fh.write('{"step": 9999999, "metrics": {"x": 1}}\n')
    assert records.last_metrics(path)[0] == 5
    check = records.check_metrics(path, 5)
    assert (check.good_through, check.bad_lines) == (5, 1) and not check.ok
    assert records.repair_torn(path) == 5 and records.check_metrics(path, 5).ok
    records.write_metrics(path, [(s, {"x": float(s)}) for s in (1, 2, 3, 5, 6, 7)])
    check = records.check_metrics(path, 7)
    assert (check.good_through, check.bad_lines, check.missing) == (3, 0, 4)
    assert records.last_metrics(path)[0] == 7


def test_a_trial_whose_state_was_removed_reruns_as_a_new_attempt_from_its_checkpoint(
        isolated: Path) -> None:
    """A rescued parent's ``state.json`` removed, as the corrupt-file message advises: its next
    run is attempt 2, from its newest checkpoint (step 4), not attempt 1 run again and merged
    with the first one (which kept its cost and steps)."""
    from warnrescue import SECTIONS, rescue

    from orchestrator.grid import expand, load_grid
    from orchestrator.run import make_job, run_attempt
    from orchestrator.scheduler._rescue import auto_rescue
    from orchestrator.store import TrialPaths, records, workspace

    path = isolated / "w.yaml"
    path.write_text("name: w\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 12\nseeds: [0]\n"
                    "axes:\n  pool: [sim-a100]\ncheckpoint: {every: 2, keep: 3}\n" + SECTIONS
                    + rescue())
    grid = load_grid(path)
    (t,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=None, submission="s1"))
    assert auto_rescue(grid, grid_dir, [t.trial_id])
    paths = TrialPaths(grid_dir, t.trial_id)
    paths.state.unlink()
    run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=None, submission="s2"))
    first, second = records.load_attempts(paths)
    assert (first.number, first.end_step, first.submission) == (1, 4, "s1")
    assert (second.number, second.resumed_from_step, second.start_step, second.submission) == (
        2, 4, 5, "s2")


def test_evaluate_over_damaged_checkpoints_says_what_is_wrong(isolated: Path) -> None:
    """A garbled MANIFEST.json (step 3) and a truncated file (step 6): ``ablate evaluate``
    names each damaged checkpoint, not "nothing to score (every saved checkpoint has its
    score)"."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.run import run_single
    from orchestrator.scheduler import evaluate
    from orchestrator.store import TrialPaths, workspace
    from orchestrator.store._checkpoints import MANIFEST, step_dir_name

    path = isolated / "ev.yaml"
    path.write_text("name: ev\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 6\nseeds: [2]\n"
                    "pool: sim-a100\noverrides: {train.prompts_per_step: 4, train.group_size: 4, "
                    "train.minibatches: 2, eval.every: 3, eval.prompts: 8}\ncheckpoint: {every: 3}\n")
    (t,) = expand(load_grid(path))
    assert run_single(str(path), t.trial_id)["state"] == "done"
    root = TrialPaths(workspace.grid_dir("ev"), t.trial_id).root / "checkpoints"
    (root / step_dir_name(3) / MANIFEST).write_text("{garbled")
    big = max((p for p in (root / step_dir_name(6)).rglob("*") if p.is_file() and p.name != MANIFEST),
              key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])
    report = evaluate(str(path))
    assert not any(report.scored.values())
    (three, six) = report.damaged[t.trial_id]
    assert three.startswith("step 3 is damaged (it has no valid MANIFEST.json")
    assert six.startswith(f"step 6 is damaged (file {big.relative_to(root / step_dir_name(6))} has ")
    lines = report.lines()
    assert lines[-1] == "reference trainer: 0 checkpoint(s) scored in 0.0s; 2 damaged checkpoint(s) not scored"
    assert not any("nothing to score" in ln for ln in lines)
    from orchestrator.cli import main

    assert main(["evaluate", str(path)]) == 1  # a checkpoint it cannot score: not a success
