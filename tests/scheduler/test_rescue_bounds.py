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
from typing import Any

import pytest
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


@pytest.mark.slow  # a real `ablate submit` on a local Ray: ~25-60 s on 2 cores
def test_a_resubmit_finishes_every_rescue_a_damaged_or_stopped_submission_left(
        isolated: Path) -> None:
    """#59 item 2, through ``ablate submit`` on one local Ray: three finished parents whose
    rescues were left (1) running by a SIGKILLed submission (a garbage line in its metrics file, item 6), (2) seeded with its ``state.json``
    then removed (as the error for a corrupt one advises), (3) refused for budget (the budget
    raised since). Each parent's pool is used by no unfinished planned trial: the resubmit
    runs all three rescues to the end instead of a KeyError for that pool, and its summary
    (the final line, ``grid_done``) counts them (item 9)."""
    import shutil
    import tempfile

    from orchestrator.scheduler import submit
    from orchestrator.trial import TrialState

    path = isolated / "left.yaml"
    path.write_text("name: left\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 6\nseeds: [0, 1, 2]\n"
                    "axes:\n  pool: [sim-a100]\ncheckpoint: {every: 2, keep: 6}\n" + SECTIONS
                    + "rescue:\n  - {when: {warning: k3_warn}, resume: {set: {rollout.weight_lag: 0}}}\n")
    grid = load_grid(path)
    grid_dir = workspace.grid_dir(grid.name)
    parents = expand(grid)
    for t in parents:
        run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=None, submission="test"))
    killed, removed = (auto_rescue(grid, grid_dir, [t.trial_id])[0] for t in parents[:2])
    paths = TrialPaths(grid_dir, killed.trial_id)
    rec = records.load_state(paths, killed.trial_id)
    rec.state = TrialState.RUNNING
    records.save_state(paths, rec)
    with open(paths.metrics, "a") as fh:  # item 6: a garbage line in a rescue trial's file
        fh.write('{"step": 9999999, "metrics": {"x": 1}}\n')
    TrialPaths(grid_dir, removed.trial_id).state.unlink()
    poor = TrialPaths(grid_dir, parents[2].trial_id)
    rec = records.load_state(poor, parents[2].trial_id)
    rec.rescues = [{"event": "warning:k3_warn", "entry": 0, "by": "rescue[0]", "step": 3,
                    "error": "budget: ...", "refused": "budget"}]
    records.save_state(poor, rec)
    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    try:
        summary = submit(str(path), progress=False, ray_tmp=ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    made = records.load_state(poor, parents[2].trial_id).rescues[-1]["trial"]
    assert made in summary["rescued"]
    for tid in (killed.trial_id, removed.trial_id, made):
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        assert rec.state is TrialState.DONE and rec.last_step == 6, tid
    assert records.load_state(TrialPaths(grid_dir, removed.trial_id), removed.trial_id).attempts >= 1
    assert summary["trials"] == 6 and summary["states"] == {"done": 6}
    assert summary["rescue_trials"] == 3
    assert any(r.startswith(f"trial {killed.trial_id}: ") and "1 torn or unreadable line(s)" in r
               for r in summary["repaired"]), summary["repaired"]
    from orchestrator.scheduler._events import summary_lines

    assert summary_lines(summary)[0].startswith("left: 6 trials (3 of them rescues) in ")


_PLAN = "name: p\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 12\nseeds: [0]\naxes:\n  pool: [sim-a100]\n"


@pytest.mark.parametrize(("checkpoint", "rescue_set", "where", "says"), [
    # item 9: no checkpoint at or before the warning's onset can ever be kept
    ("{every: 1, keep: 1}", "rollout.weight_lag: 0", "rescue[0].when.warning",
     ("fires 1 step(s) after its onset, when the 1 checkpoint(s) kept every 1 step(s) are all "
      "after it: this entry can never act; fix: checkpoint.keep: 2 or more")),
    ("{every: 12, keep: 3}", "rollout.weight_lag: 0", "rescue[0].when.warning",
     "has its onset at step 11 at the latest, before the first checkpoint (checkpoint.every 12)"),
    # item 9: a set: value out of range, at its own key (not the axes with an exclude: rule)
    ("{every: 2, keep: 3}", "rollout.weight_lag: -3", "rescue[0].resume.set.rollout.weight_lag",
     "weight_lag must be in 0..64 steps, got -3 (derived from t"),
    # item 3: a setting the checkpoint's weights cannot take (it failed three times at run time)
    ("{every: 2, keep: 3}", "model.d_model: 128", "rescue[0].resume.set.model.d_model",
     "model.d_model cannot change on a resume: the checkpoint it starts from holds the model's"),
])
def test_a_rescue_that_cannot_act_or_run_is_refused_at_plan(
        isolated: Path, checkpoint: str, rescue_set: str, where: str, says: str) -> None:
    from orchestrator.exceptions import GridError

    path = isolated / "p.yaml"
    path.write_text(_PLAN + f"checkpoint: {checkpoint}\n" + SECTIONS + "rescue:\n  - {when: "
                    "{warning: k3_warn}, resume: {set: {" + rescue_set + "}}}\n")
    with pytest.raises(GridError) as err:
        expand(load_grid(path))
    text = str(err.value)
    assert f"p.yaml:20: {where}: " in text and says in text and "exclude" not in text


def _ran_four_steps(isolated: Path) -> tuple[Path, Any, Any, Path]:
    """A one-trial grid run to its end (4 steps, checkpoints at 2 and 4): what a resume starts
    from."""
    path = isolated / "r.yaml"
    path.write_text(_PLAN.replace("steps: 12", "steps: 4") + "checkpoint: {every: 2, keep: 3}\n")
    grid = load_grid(path)
    (t,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=None, submission="test"))
    return path, grid, t, grid_dir


def test_a_resume_set_the_checkpoint_cannot_take_is_refused_before_anything_is_written(
        isolated: Path) -> None:
    """``ablate resume --set model.d_model=128`` (item 3): one line at resume time, naming the
    flag and the fix, instead of three failed attempts of shape errors."""
    from orchestrator.exceptions import UserError
    from orchestrator.scheduler._rescue import plan

    _, grid, t, grid_dir = _ran_four_steps(isolated)
    before = TrialPaths(grid_dir, t.trial_id).state.read_bytes()
    with pytest.raises(UserError) as err:
        plan(grid, grid_dir, [t], pool="sim-a100", start=2, sets={"model.d_model": 128}, reason="x")
    assert str(err.value).startswith("--set model.d_model=128: model.d_model cannot change on a "
                                     "resume") and "fix: make it an axis of the grid" in str(err.value)
    assert TrialPaths(grid_dir, t.trial_id).state.read_bytes() == before
    assert sorted(p.name for p in (grid_dir / "trials").iterdir()) == [t.trial_id]


def test_a_resume_may_set_a_model_key_that_shapes_no_weight(isolated: Path) -> None:
    """``model.n_heads`` and ``model.aux_loss_coef`` shape no parameter of the simulator's model
    (``sim/model.py: init_params``): ``ablate resume --set`` of them runs the derived trial from
    the checkpoint to its end, where ``model.d_model`` is refused (above)."""
    from orchestrator.scheduler import resume

    path, _, t, grid_dir = _ran_four_steps(isolated)
    got = resume(str(path), trial_ids=[t.trial_id], pool="sim-a100", start=2, local=True,
                 sets={"model.n_heads": 2, "model.aux_loss_coef": 0.05}, progress=False)
    (item,) = got["resumed"]
    rec = records.load_state(TrialPaths(grid_dir, item["trial_id"]), item["trial_id"])
    assert item["from_step"] == 2 and rec.state.value == "done" and rec.last_step == 4
