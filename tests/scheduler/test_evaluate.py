"""``ablate evaluate``: a recorded grid's checkpoints scored after the fact by the reference
evaluator, with exactly the numbers a grid with ``eval: {reference: trainer}`` logs in-process;
idempotent; carried into ``ablate compare`` and the trial's MLflow run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from orchestrator import metrics as M
from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.scheduler import evaluate
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.store.reference import read_reference
from orchestrator.tracking import client

GRID = """\
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: 6
seeds: [2]
pool: sim-a100
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  train.minibatches: 2
  eval.every: 3
  eval.prompts: 8
checkpoint: {{every: 3}}
"""


def _record(isolated: Path, name: str, extra: str = "") -> tuple[Path, str]:
    path = isolated / f"{name}.yaml"
    path.write_text(GRID.format(name=name) + extra)
    (trial,) = expand(load_grid(path))
    assert run_single(str(path), trial.trial_id)["state"] == "done"
    return path, trial.trial_id


@pytest.mark.slow  # two in-process trials and a compare: ~45 s on 2 cores
def test_evaluate_scores_old_checkpoints_as_the_in_process_reference_would(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, tid = _record(isolated, "old")  # recorded without the key: no reference scores
    paths = TrialPaths(workspace.grid_dir("old"), tid)
    assert read_reference(paths) is None

    assert main(["evaluate", str(old)]) == 0
    assert "scored steps 3, 6" in capsys.readouterr().out
    held = read_reference(paths)
    assert held is not None and sorted(held.scores) == [3, 6] and held.sent == {3, 6}
    assert held.evaluator == "sim-ref-1" and held.seconds > 0

    # The same trial with the key (another id: the key is part of it) logs, in-process, the
    # very numbers scored after the fact: training is unchanged and the evaluator draws from
    # (seed, step) only.
    new, new_tid = _record(isolated, "new", "eval: {reference: trainer}\n")
    assert new_tid != tid
    logged = {s: row[M.EVAL_REWARD_REF] for s, row in records.iter_metrics(
        TrialPaths(workspace.grid_dir("new"), new_tid).metrics) if M.EVAL_REWARD_REF in row}
    assert logged == {s: v for s, (v, _) in held.scores.items()}

    # Idempotent: nothing is scored twice, and a trial that logged its own scores needs none.
    assert not any(evaluate(str(old)).scored.values())
    again = evaluate(str(new))
    assert not any(again.scored.values()) and read_reference(
        TrialPaths(workspace.grid_dir("new"), new_tid)) is None
    assert "nothing to score" in again.lines()[-1]

    # The trial's MLflow run has them, and compare carries them into its files.
    run_id = records.load_state(paths, tid).mlflow_run_id
    uri = workspace.tracking_uri()
    history = client(uri).get_metric_history(run_id, M.EVAL_REWARD_REF)
    assert sorted((m.step, m.value) for m in history) == sorted(
        (s, v) for s, (v, _) in held.scores.items())
    out = isolated / "res"
    assert main(["compare", str(old), "--out", str(out)]) == 0
    with open(out / "trials.csv", newline="") as fh:
        row = next(csv.DictReader(fh))
    assert float(row["final_reward_ref"]) == held.scores[6][0]
    assert "## Reference evaluation" in (out / "summary.md").read_text()
    with open(out / "cost.csv", newline="") as fh:  # the scoring's time, beside the trial's
        trial_cost = next(r for r in csv.DictReader(fh) if r["level"] == "trial")
    assert float(trial_cost["reference_eval_hours"]) == pytest.approx(held.seconds / 3600, rel=1e-5)
    assert "| reference eval |" in (out / "summary.md").read_text()
    regenerate = json.loads((out / "MANIFEST.json").read_text())["regenerate"]
    assert "ablate evaluate" in regenerate and regenerate.index("evaluate") < regenerate.index("compare")


def test_evaluate_refuses_in_one_line(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = isolated / "none.yaml"
    path.write_text(GRID.format(name="none"))
    assert main(["evaluate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no recorded trials" in err and "ablate submit" in err


VERL = "name: {name}\nrecipe: verl/cpu_tiny\nbackend: verl\nsteps: 3\npool: {pool}\n"


@pytest.mark.parametrize(("recorded", "evaluated", "says"), [
    # A verl trial on a gpu pool has no fp32 trainer reference.
    (VERL.format(name="v", pool="h100"), "", ["trial t", "on pool h100", "runs on the cpu pools only"]),
    # The engine reference runs its job here: a gpu evaluation pool needs its GPUs here.
    (VERL.format(name="v", pool="h100"), "eval: {reference: engine, pool: h20}\n",
     [("eval.pool h20: the evaluation job runs on this machine and needs verl and the pool's 8 "
      "GPU(s) on one node")]),
    # A trial recorded under a file with another task than the one the job would load.
    (VERL.format(name="c", pool="cpu-bf16") + "overrides: {assets.max_digits: 3}\n",
     "eval: {reference: engine, pool: cpu-fp32}\n",
     ["trial t", "sets assets.max_digits = 3", "fix: leave the trial out"]),
])
def test_evaluate_refuses_trials_it_cannot_score_in_one_line_before_anything_is_written(
        isolated: Path, capsys: pytest.CaptureFixture[str], recorded: str, evaluated: str,
        says: list[str]) -> None:
    """A recorded trial ``ablate evaluate`` cannot score with the grid file's reference: one
    line naming it and why, no lease taken, nothing written."""
    path = isolated / "g.yaml"
    path.write_text(recorded)
    (trial,) = expand(load_grid(path))
    name = load_grid(path).name
    paths = TrialPaths(workspace.grid_dir(name), trial.trial_id)
    paths.root.mkdir(parents=True)
    records.save_spec(paths, trial)
    path.write_text(recorded.split("overrides:")[0] + evaluated)
    capsys.readouterr()  # planning a gpu pool here warns once that sglang is not installed
    assert main(["evaluate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(part in err for part in says), err
    assert not paths.reference.exists() and not (workspace.grid_dir(name) / "lease.json").exists()


def test_adding_the_key_to_a_grid_that_ran_is_refused_with_ablate_evaluate_as_a_fix(
        isolated: Path) -> None:
    """The key gives every trial a new id: under the same name that is another grid (refused,
    naming `ablate evaluate`), while a grid without it keeps its recorded identity."""
    from orchestrator.exceptions import UserError
    from orchestrator.scheduler._identity import check_identity

    path = isolated / "g.yaml"
    path.write_text(GRID.format(name="g"))
    grid = load_grid(path)
    grid_dir = workspace.grid_dir("g")
    grid_dir.mkdir(parents=True)
    assert check_identity(grid, grid_dir, expand(grid)) is None
    assert check_identity(grid, grid_dir, expand(grid)) is None  # unchanged: nothing to say
    path.write_text(GRID.format(name="g") + "eval: {reference: trainer}\n")
    ref = load_grid(path)
    with pytest.raises(UserError, match=r"eval: none -> \{\"reference\": \"trainer\"\}.*"
                       r"`ablate evaluate .*g\.yaml`"):
        check_identity(ref, grid_dir, expand(ref))
