"""The grid's rescue policy (``rescue:``) on the real CPU simulator and, once, the real Ray Tune
scheduler with the fault hook of ``tests/doubles.py``.

A warning is made real at this scale (12 steps) by an ``above`` rule with ``verdict: unstable``
on the k3 KL sim-a100 measures: weights two syncs stale make it 5e-3..1e-2 from step 2 (measured
on this grid: 6.1e-5, 5.0e-3, 1.0e-2, 8.1e-3 at steps 1-4). ``min_step: 3`` puts the warning's
onset at step 3; with ``checkpoint.every: 2`` the rescue starts from step 2. The switch is
``rollout.weight_lag: 0`` (the engine synced every step): in the simulator a loss-side
correction (sequence TIS + RS, k3 RS) leaves k3 where it was over 40 steps, since k3 measures
the engine against the trainer and a correction only reweights the loss, so the test switches
what the simulator models as the source of sim-a100's k3.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import doubles
import pytest
from warnrescue import K3, SECTIONS, THRESHOLD, rescue
from webhooks import Receiver

from orchestrator.compare import compare
from orchestrator.grid import expand, load_grid
from orchestrator.run import make_job, run_attempt
from orchestrator.scheduler._rescue import auto_rescue
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.tracking import parent_run

TESTS = Path(__file__).resolve().parents[1]


def _grid(name: str) -> str:
    """One sim-a100 trial of 12 steps that warns at step 3 and is rescued (``warnrescue``)."""
    return (f"name: {name}\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 12\nseeds: [0]\n"
            "axes:\n  pool: [sim-a100]\ncheckpoint: {every: 2, keep: 3}\n"
            + SECTIONS + rescue())


def _run(grid, trial) -> dict:
    """One attempt in this process, as a Ray worker runs it, tracked in the grid's MLflow run."""
    with parent_run(grid, tracking_uri=workspace.tracking_uri(None, None),
                    workdir=workspace.workdir(None)) as target:
        job = make_job(grid, trial, grid_dir=workspace.grid_dir(grid.name), tracking=target,
                       submission="test")
        return run_attempt(job)


def _k3(grid_dir: Path, tid: str) -> dict[int, float]:
    return {s: m[K3] for s, m in records.iter_metrics(TrialPaths(grid_dir, tid).metrics)}


def _use_the_double(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend ``sim`` is the test double, in this process and in the Ray workers it starts."""
    doubles.register(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(TESTS.parent)]))


def _submit(path: Path, times: int = 1) -> list[dict]:
    """``ablate submit`` of ``path`` in this process, ``times`` times over, on one local Ray."""
    from orchestrator.scheduler import submit

    ray_tmp = tempfile.mkdtemp(prefix="rp", dir="/tmp")  # short: Ray's socket paths have a length cap
    try:
        return [submit(str(path), progress=False, ray_tmp=ray_tmp) for _ in range(times)]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def warned(tmp_path_factory: pytest.TempPathFactory):
    """A sim-a100 trial stopped on its k3 warning, rescued once and the rescue run (shared)."""
    tmp = tmp_path_factory.mktemp("warned")
    mp = pytest.MonkeyPatch()
    mp.setenv("ABLATE_WORKDIR", str(tmp / ".ablate"))
    mp.setenv("ABLATE_RECIPES", str(TESTS.parent / "recipes"))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = tmp / "warn.yaml"
    path.write_text(_grid("warn"))
    grid = load_grid(path)
    (parent,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    out = _run(grid, parent)
    first = auto_rescue(grid, grid_dir, [parent.trial_id])
    again = auto_rescue(grid, grid_dir, [parent.trial_id])  # a re-submission before it ran
    child_out = _run(grid, first[0])
    after = auto_rescue(grid, grid_dir, [parent.trial_id, first[0].trial_id])
    results = compare(path, out_dir=tmp / "results")
    yield {"grid": grid, "dir": grid_dir, "parent": parent, "out": out, "first": first,
           "again": again, "child_out": child_out, "after": after, "results": results}
    mp.undo()


def test_a_warning_stops_the_parent_and_records_it_rescued_not_collapsed(warned) -> None:
    out, parent = warned["out"], warned["parent"]
    v = out["verdict"]
    assert v["rescued_step"] == 3 and v["rescued_by"] == "k3_warn"
    assert v["kind"] == "unstable" and v["reason"].startswith("rescued at step 3 on warning k3_warn")
    assert out["state"] == "done" and out["last_step"] == 4 < parent.steps  # stopped when it fired
    rec = records.load_state(TrialPaths(warned["dir"], parent.trial_id), parent.trial_id)
    (note,) = rec.rescues
    assert note["event"] == "warning:k3_warn" and note["step"] == 3 and note["start"] == 2
    assert note["by"] == "rescue[0]" and note["trial"] == warned["first"][0].trial_id
    # `ablate status` lists it, and the rescue names its parent.
    from orchestrator.scheduler._progress import collect

    views = {t.trial_id: t for t in collect(warned["dir"]).trials}
    child = warned["first"][0].trial_id
    assert views[parent.trial_id].rescue == (f"rescued by rescue[0] on warning:k3_warn @3 as {child} "
                                            "on sim-a100 from step 2")
    assert views[child].rescue == f"rescue of {parent.trial_id} (warning:k3_warn)"


def test_the_correction_switch_runs_from_the_checkpoint_before_the_warning_and_k3_falls(warned) -> None:
    (child,) = warned["first"]
    parent = warned["parent"]
    assert child.derived_from == (parent.trial_id, 2)
    assert dict(child.overrides)["rollout.weight_lag"] == 0
    crec = records.load_state(TrialPaths(warned["dir"], child.trial_id), child.trial_id)
    assert crec.rescue_of == {"parent": parent.trial_id, "event": "warning:k3_warn", "step": 2,
                              "lineage": [{"entry": 0, "event": "warning:k3_warn", "step": 3,
                                           "trial": child.trial_id}]}
    # The rescue is no rescue's parent: it ran all its steps without stopping on the warning.
    assert warned["child_out"]["last_step"] == 12 and warned["child_out"]["verdict"].get("rescued_step") is None
    pk3, ck3 = _k3(warned["dir"], parent.trial_id), _k3(warned["dir"], child.trial_id)
    assert [s for s in ck3 if s <= 2] == [1, 2] and ck3[2] == pk3[2]  # the parent's history up to 2
    # Step 3 measures what the parent's step 3 did (the engine's weights at that step come from
    # the checkpoint, taken with the old setting); the switch shows from step 4 on.
    assert ck3[3] == pytest.approx(pk3[3])
    after = [ck3[s] for s in range(4, 13)]
    assert max(after) < THRESHOLD < min(pk3[3], pk3[4])  # below the warning's threshold, every step
    assert max(after) < pk3[4] / 10


def test_a_resubmission_rescues_nothing_twice(warned) -> None:
    (child,) = warned["first"]
    # Before the rescue ran (a killed submit): the same child again, no second one.
    assert [t.trial_id for t in warned["again"]] == [child.trial_id]
    # After it ran: nothing; one derived trial on disk, one note on the parent.
    assert warned["after"] == []
    tids = sorted(p.name for p in (warned["dir"] / "trials").iterdir())
    assert tids == sorted([warned["parent"].trial_id, child.trial_id])


@pytest.mark.slow
def test_an_infra_failure_moves_to_another_pool_after_its_retries(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``ablate submit``: every attempt on sim-a100 fails (the double's fault hook); after
    ``retries.max`` the trial resumes from its checkpoint on sim-h20; submitting again runs and
    rescues nothing. The collapse entry beside it is not used."""
    _use_the_double(monkeypatch)
    hook = Receiver()
    monkeypatch.setenv("ABLATE_TEST_WEBHOOK", hook.url)
    monkeypatch.setenv("ABLATE_DOUBLE_BAD_POOL", "sim-a100")
    monkeypatch.setenv("ABLATE_DOUBLE_STEP_S", "0.001")
    path = isolated / "infra.yaml"
    path.write_text("""\
name: infra
recipe: sim/grpo_tiny
backend: sim
steps: 10
seeds: [0]
axes:
  pool: [sim-a100]
overrides: {correction.is_level: token}
checkpoint: {every: 5, keep: 2}
retries: {max: 1}
rescue:
  - {when: collapsed, resume: {pool: sim-h100}}
  - {when: infra_failed, resume: {pool: sim-h20}}
notify: [{url_env: ABLATE_TEST_WEBHOOK, min_interval_s: 0}]
""")
    (t,) = expand(load_grid(path))
    try:
        summary, again = _submit(path, times=2)
    finally:
        hook.close()
    assert summary["rescued"] == [t.trial_id]
    # The alerts: the failure and the rescue once over both submissions, each submission's end.
    assert sorted((b["event"], b.get("trial_id")) for b in hook.bodies) == [
        ("grid_done", None), ("grid_done", None), ("infra_failed", t.trial_id), ("rescued", t.trial_id)]
    paths = TrialPaths(workspace.grid_dir("infra"), t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    assert rec.state.value == "done" and rec.verdict["kind"] == "healthy" and rec.pool == "sim-h20"
    assert [(a.pool, a.outcome) for a in records.load_attempts(paths)] == [
        ("sim-a100", "infra_failure"), ("sim-a100", "infra_failure"), ("sim-h20", "completed")]
    (note,) = rec.rescues
    assert note["event"] == "infra_failed" and note["entry"] == 1 and note["pool"] == "sim-h20"
    assert note["start"] == 5
    assert again["rescued"] == [] and again["skipped_finished"] == 1
    assert len(records.load_attempts(paths)) == 3
    # The grid's MLflow parent run links the trial and its rescue; compare counts it recovered.
    from mlflow import MlflowClient

    tags = MlflowClient(summary["tracking_uri"]).get_run(summary["parent_run_id"]).data.tags
    assert tags[f"rescue.{t.trial_id}"] == f"infra_failed @6: {t.trial_id} on sim-h20 from step 5"
    import csv

    from orchestrator.compare import compare

    (row,) = list(csv.DictReader((compare(str(path), out_dir=isolated / "res") / "rescues.csv")
                                 .read_text().splitlines()))
    assert (row["rescue"], row["parent"], row["event"], row["recovered"]) == (
        t.trial_id, t.trial_id, "infra_failed", "True")


SLOW_GRID = """\
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: 40
seeds: [0]
axes:
  pool: [sim-a100, sim-h20]
overrides: {{correction.is_level: none}}
checkpoint: {{every: 5, keep: 8}}
early_stop: false
rescue:
  - {{when: collapsed, resume: {{pool: {rescue_pool}}}}}
"""


def _slow_grid(isolated: Path, monkeypatch: pytest.MonkeyPatch, name: str,
               rescue_pool: str) -> tuple[Path, dict, dict[str, TrialPaths]]:
    """The double's sim-a100 trial collapses within a second; its sim-h20 trial takes ~30 s."""
    _use_the_double(monkeypatch)
    monkeypatch.setenv("ABLATE_DOUBLE_SLOW_POOL", "sim-h20:0.75")  # 40 steps: ~30 s
    path = isolated / f"{name}.yaml"
    path.write_text(SLOW_GRID.format(name=name, rescue_pool=rescue_pool))
    trials = {t.pool: t for t in expand(load_grid(path))}
    grid_dir = workspace.grid_dir(name)
    return path, trials, {p: TrialPaths(grid_dir, t.trial_id) for p, t in trials.items()}


@pytest.mark.slow
def test_a_collapse_is_rescued_while_the_grids_other_trials_still_run(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab's grid runs for days: a trial that collapses is rescued when it ends, not once the
    last trial of the grid has."""
    path, trials, paths = _slow_grid(isolated, monkeypatch, "early", "sim-h100")
    (summary,) = _submit(path)
    parent = records.load_state(paths["sim-a100"], trials["sim-a100"].trial_id)
    (note,) = parent.rescues
    child = note["trial"]
    assert summary["rescued"] == [child] and note["pool"] == "sim-h100"
    grid_dir = paths["sim-a100"].root.parent.parent
    *_, ran = records.load_attempts(TrialPaths(grid_dir, child))
    (slow,) = records.load_attempts(paths["sim-h20"])
    assert (ran.pool, ran.outcome) == ("sim-h100", "completed")
    assert ran.started_at < slow.ended_at, (ran.started_at, slow.ended_at)
    # In the grid's own fit: no rescue round after it (its Tune run would be "<id>-rescue").
    assert [d.name for d in (grid_dir / "tune").iterdir()] == [ran.submission]


@pytest.mark.slow
def test_a_grid_cancelled_cancels_its_rescues_and_makes_no_more(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ablate cancel GRID`` while a rescue runs (the collapsed trial resumed in place on the
    slow pool): the rescue is cancelled with the grid's other trials, and a cancelled trial is
    no collapse to rescue: the submission ends with the one rescue it had made."""
    import threading
    import time

    from orchestrator.scheduler import cancel

    path, trials, paths = _slow_grid(isolated, monkeypatch, "cancelled", "sim-h20")
    grid_dir = paths["sim-a100"].root.parent.parent
    asked: list[int] = []

    def cancel_once_the_rescue_runs() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if paths["sim-a100"].state.exists():
                done = records.load_state(paths["sim-a100"], trials["sim-a100"].trial_id)
                kids = [TrialPaths(grid_dir, n["trial"]) for n in done.rescues if n.get("trial")]
                slow = records.load_state(paths["sim-h20"], trials["sim-h20"].trial_id)
                if (kids and kids[0].state.exists() and slow.state.value == "running"
                        and records.load_state(kids[0], kids[0].root.name).state.value == "running"):
                    asked.append(cancel(str(path)))
                    return
            time.sleep(0.1)

    canceller = threading.Thread(target=cancel_once_the_rescue_runs, daemon=True)
    canceller.start()
    (summary,) = _submit(path)
    canceller.join(timeout=10)
    assert asked == [2], asked  # the slow trial and the rescue were left to cancel
    parent = trials["sim-a100"].trial_id
    first = records.load_state(paths["sim-a100"], parent)
    (note,) = first.rescues  # one rescue, none of its cancelled end
    assert (note["event"], note["trial"], note["pool"]) == ("collapsed", parent, "sim-h20")
    assert first.state.value == "cancelled", first.state  # the rescue: the trial resumed in place
    second = records.load_state(paths["sim-h20"], trials["sim-h20"].trial_id)
    assert second.state.value == "cancelled", second.state
    assert summary["rescued"] == [parent]
    assert sorted(p.name for p in (grid_dir / "trials").iterdir()) == sorted(
        t.trial_id for t in trials.values())


def test_compare_reports_the_rescue_per_cell_with_its_gain_over_the_parent(warned) -> None:
    import csv

    from orchestrator import metrics as M

    (child,) = warned["first"]
    parent = warned["parent"]
    (row,) = list(csv.DictReader((warned["results"] / "rescues.csv").read_text().splitlines()))
    reward = {tid: [m[M.TRAIN_REWARD] for _, m in records.iter_metrics(TrialPaths(warned["dir"], tid).metrics)]
              for tid in (parent.trial_id, child.trial_id)}
    assert row["rescue"] == child.trial_id and row["parent"] == parent.trial_id
    assert row["event"] == "warning:k3_warn" and row["from_step"] == "2" and row["recovered"] == "True"
    assert row["metric"] == M.TRAIN_REWARD  # the grid evaluates nothing (eval.every: 100)
    assert float(row["final"]) == pytest.approx(reward[child.trial_id][-1])
    assert float(row["parent final"]) == pytest.approx(reward[parent.trial_id][-1])
    assert float(row["parent peak"]) == pytest.approx(max(reward[parent.trial_id]))
    text = (warned["results"] / "summary.md").read_text()
    gain = reward[child.trial_id][-1] - reward[parent.trial_id][-1]
    assert "## Rescues" in text and "| 1 | 1 (100% [" in text and f"{gain:+.3f} (n=1)" in text
    # The rescue's MLflow run names its parent.
    from mlflow import MlflowClient

    run_id = records.load_state(TrialPaths(warned["dir"], child.trial_id), child.trial_id).mlflow_run_id
    tags = MlflowClient(workspace.tracking_uri(None, None)).get_run(run_id).data.tags
    assert tags["rescue.of"] == parent.trial_id and tags["rescue.event"] == "warning:k3_warn"


def test_which_entry_acts_bounds_and_old_records() -> None:
    """``times`` bounds an entry per trial; a rescue is rescued again only with ``of_rescues``;
    a budget refusal does not count; a record from before the list counts as its one note."""
    from orchestrator.grid import entry_for, warning_stops
    from orchestrator.schema import RescueEntry, ResumeAction

    policy = (RescueEntry(when="collapsed", resume=ResumeAction(pool="sim-h20")),
              RescueEntry(when="collapsed", resume=ResumeAction(pool="sim-h100"), times=2),
              RescueEntry(when={"warning": "k3_warn"}, resume=ResumeAction(set={"rollout.weight_lag": 0})),
              RescueEntry(when="infra_failed", resume=ResumeAction(pool="sim-h20"), of_rescues=True))
    rec = records.TrialRecord(trial_id="t1")
    assert entry_for(policy, "collapsed", rec)[0] == 0
    assert warning_stops(policy, rec) == {"k3_warn"}
    rec.rescues = [{"event": "collapsed", "entry": 0, "trial": "t1", "by": "rescue[0]"}]
    # Entry 0 is spent; entry 1 would rescue a rescue (moved in place by entry 0): not asked.
    assert entry_for(policy, "collapsed", rec) is None
    assert warning_stops(policy, rec) == frozenset()
    assert entry_for(policy, "infra_failed", rec)[0] == 3  # of_rescues: true
    fresh = records.TrialRecord(trial_id="t2", rescues=[
        {"event": "collapsed", "entry": 0, "refused": "budget", "error": "budget: ..."}])
    assert entry_for(policy, "collapsed", fresh)[0] == 0  # a budget refusal is tried again
    old = records.TrialRecord(trial_id="t3", rescue={"by": "on_collapse", "trial": "t9", "pool": "sim-h20"})
    assert entry_for(policy[:1], "collapsed", old) is None  # rescued before the list existed
    child = records.TrialRecord(trial_id="t4", rescue_of={"parent": "t1", "event": "collapsed", "step": 5})
    assert entry_for(policy, "collapsed", child) is None and entry_for(policy, "infra_failed", child)[0] == 3


def test_a_rescue_over_budget_is_refused_with_its_reason_and_tried_again_later(
        isolated: Path) -> None:
    """``budget.gpu_hours`` (one trial's projected cost, a little more) spent: the warning's
    rescue is refused, recorded with the reason, no trial derived; with the budget raised (a
    re-submission) it is made."""
    from orchestrator.scheduler._budget import Planner

    path = isolated / "poor.yaml"
    path.write_text(_grid("poor") + "budget: {gpu_hours: 0.00034}\n")
    grid = load_grid(path)
    (parent,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    job = make_job(grid, parent, grid_dir=grid_dir, tracking=None, submission="test")
    run_attempt(job)
    planner = Planner(grid, grid_dir, [parent], grid.pools.pools)
    # The rescue's cost is its steps left at the parent's measured step time, so how close the
    # budget is depends on how fast the parent ran (a quick run made the rescue fit in a CI
    # run): the planner's limit is set to what the parent spent, which no rescue fits in.
    planner.spec = planner.spec.model_copy(update={"gpu_hours": planner.spent()})
    assert auto_rescue(grid, grid_dir, [parent.trial_id], budget=planner) == []
    rec = records.load_state(TrialPaths(grid_dir, parent.trial_id), parent.trial_id)
    (note,) = rec.rescues
    assert note["refused"] == "budget" and note["error"].startswith("budget: the rescue would cost")
    assert f"of budget.gpu_hours={planner.spec.gpu_hours:g} h spent; raise it and submit again" \
        in note["error"]
    assert sorted(p.name for p in (grid_dir / "trials").iterdir()) == [parent.trial_id]
    path.write_text(_grid("poor") + "budget: {gpu_hours: 10}\n")
    richer = load_grid(path)
    (child,) = auto_rescue(richer, grid_dir, [parent.trial_id],
                           budget=Planner(richer, grid_dir, [parent], richer.pools.pools))
    assert child.derived_from == (parent.trial_id, 2)
