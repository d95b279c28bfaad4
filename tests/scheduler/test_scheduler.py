"""Scheduler on a real local Ray cluster with several raylets, one pool per node.

Each node carries one pool's custom resource (``pool:<name>``) so placement is observable: every
attempt records ``ray.get_runtime_context().get_node_id()``. End-to-end tests run the real CPU
simulator on a tiny config (~0.15 s a step); the cancel test uses the deterministic double of
``tests/doubles.py`` (registered as ``sim``; Ray workers import it from ``tests/`` on their
PYTHONPATH) because it needs slow, predictable steps. One cluster serves the whole module.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import doubles
import pytest
from rayclusters import pool_cluster, submit_while, write_grid
from trialrecords import mlflow_steps
from trialrecords import trials as read_trials
from warnrescue import K3, SECTIONS, THRESHOLD, rescue

from orchestrator import scheduler
from orchestrator.exceptions import ConcurrencyError
from orchestrator.store import TrialPaths, records

TESTS = Path(__file__).resolve().parents[1]  # doubles.py: Ray workers import it from here
REPO = TESTS.parent
POOL_NODES = {"sim-h100": 2, "sim-a100": 2, "sim-h20": 1}  # pool -> capacity (= CPUs of its node)


@pytest.fixture(scope="module")
def cluster():
    with pool_cluster(list(POOL_NODES.items()), extra_paths=[TESTS],
                      env={"ABLATE_DOUBLE_STEP_S": "0.05"}) as (c, started):
        yield c, {pool: node.node_id for pool, node in zip(POOL_NODES, started)}


@pytest.fixture
def setup(isolated: Path, cluster):
    return isolated, cluster


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> None:
    doubles.register(monkeypatch)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals],
                    key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.slow
def test_placement_concurrency_and_unplaceable_pool(setup, capsys) -> None:
    tmp, (c, nodes) = setup
    path = write_grid(tmp / "g.yaml", "placement", steps=15, seeds=[0, 1], levels=["token", "sequence"],
                 pools=["sim-h100", "sim-a100", "sim-h20", "sim-l20"],
                 budget="{max_parallel: 4, per_pool: {sim-h100: 1}}", extra="collapse: {rules: none}\n")
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    trials = read_trials(Path(summary["grid_dir"]))
    assert summary["states"] == {"done": 12, "pending": 4}
    by_pool: dict[str, list[tuple[float, float]]] = {}
    for t in trials.values():
        pool = t["spec"]["pool"]
        if pool == "sim-l20":
            assert t["state"].state.value == "pending" and not t["attempts"]
            assert "no node of the Ray cluster advertises pool:sim-l20" in t["state"].pending_reason
            continue
        assert t["steps"] == list(range(1, 16))
        for a in t["attempts"]:
            assert a.node == nodes[pool], f"{t['spec']['trial_id']} of {pool} ran on {a.node}"
            by_pool.setdefault(pool, []).append((a.started_at, a.ended_at))
    # Limits hold, and are reached (so the test would notice a limit that does nothing).
    assert _max_overlap(by_pool["sim-h100"]) == 1  # budget.per_pool
    assert _max_overlap(by_pool["sim-a100"]) == 2  # node capacity
    assert _max_overlap(by_pool["sim-h20"]) == 1
    assert _max_overlap([iv for ivs in by_pool.values() for iv in ivs]) <= 4
    pending = {p["trial_id"]: p["reason"] for p in summary["pending"]}
    assert len(pending) == 4 and all("pool:sim-l20" in r for r in pending.values())
    capsys.readouterr()
    assert scheduler.status_command("placement", as_json=True) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["pools"]["sim-l20"]["pending"] == 4 and view["pools"]["sim-a100"]["done"] == 4
    assert all("pool:sim-l20" in t["note"] for t in view["trials"] if t["pool"] == "sim-l20")
    # Submitting again runs nothing that finished.
    again = scheduler.submit(str(path), address=c.address, progress=False)
    assert again["skipped_finished"] == 12
    assert sum(len(t["attempts"]) for t in read_trials(Path(summary["grid_dir"])).values()) == 12


def test_second_submit_is_refused_while_one_runs(setup) -> None:
    tmp, (c, _nodes) = setup
    path = write_grid(tmp / "g.yaml", "busy", steps=5, seeds=[0], levels=["token"], pools=["sim-h100"],
                 budget="{max_parallel: 1}")
    grid_dir = tmp / ".ablate" / "busy"
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, time; from orchestrator.store import GridLease; "
         "lease = GridLease(sys.argv[1], 'busy'); lease.acquire('other-sub'); print('held', flush=True); "
         "time.sleep(60)"), str(grid_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConcurrencyError) as exc:
            scheduler.submit(str(path), address=c.address, progress=False)
        msg = str(exc.value)
        assert "\n" not in msg and f"pid {holder.pid}" in msg and "other-sub" in msg
        assert not (grid_dir / "trials").exists() and not (grid_dir / "tune").exists()
    finally:
        holder.kill()
        holder.wait()


def _wait_for_old_workers(grid_dir: Path, timeout: float = 60) -> None:
    """Until no trial's run lock is held (a killed driver's workers may still end an attempt)."""
    from filelock import FileLock, Timeout

    deadline = time.time() + timeout
    for lock_path in sorted((grid_dir / "trials").glob("*/.run.lock")):
        while True:
            try:
                with FileLock(str(lock_path)).acquire(timeout=0):
                    break
            except Timeout:
                assert time.time() < deadline, f"{lock_path} still held after {timeout} s"
                time.sleep(0.1)


CRASH_DRIVER = """\
from orchestrator import scheduler
scheduler.submit({grid!r}, address={address!r}, progress=False)
"""


@pytest.mark.slow
def test_sigkill_of_the_orchestrator_then_resubmit(setup) -> None:
    tmp, (c, _nodes) = setup
    path = write_grid(tmp / "g.yaml", "crash", steps=30, seeds=[0, 1], levels=["token", "sequence"],
                 pools=["sim-h100", "sim-a100", "sim-h20"], budget="{max_parallel: 4}",
                 extra="collapse: {rules: none}\n")
    grid_dir = tmp / ".ablate" / "crash"
    script = tmp / "driver.py"
    script.write_text(CRASH_DRIVER.format(grid=str(path), address=c.address))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.time() + 240
    try:
        while time.time() < deadline:  # kill once some trials are done and others mid-run
            ts = read_trials(grid_dir) if (grid_dir / "trials").exists() else {}
            done = sum(t["state"].state.value == "done" for t in ts.values())
            # Mid-run with steps to go: a dead driver's worker can outlive it briefly and must
            # not be able to finish the trial before Ray stops it.
            mid = sum(t["state"].state.value == "running" and 12 <= len(t["steps"]) <= 20
                      for t in ts.values())
            if done >= 2 and mid >= 1:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the grid never reached a mid-run point")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _wait_for_old_workers(grid_dir)  # Ray stops the dead driver's workers within seconds
    before = read_trials(grid_dir)
    done_before = {tid for tid, t in before.items() if t["state"].state.value == "done"}
    interrupted = {tid for tid, t in before.items() if t["state"].state.value == "running"}
    assert len(before) == 12 and done_before and interrupted

    summary = scheduler.submit(str(path), address=c.address, progress=False)
    after = read_trials(grid_dir)
    assert summary["states"] == {"done": 12} and summary["skipped_finished"] == len(done_before)
    uri = summary["tracking_uri"]
    for tid, t in after.items():
        assert t["steps"] == list(range(1, 31)), tid  # no step lost or duplicated on disk
        for key in ("critic/score/mean", "rollout_corr/k3_kl"):
            assert mlflow_steps(uri, t["state"].mlflow_run_id, key) == list(range(1, 31)), (tid, key)
        outcomes = [a.outcome for a in t["attempts"]]
        if tid in done_before:
            assert outcomes == ["completed"]  # not rerun
        assert outcomes[-1] == "completed" and outcomes.count("completed") == 1
    resumed = [after[tid]["attempts"] for tid in interrupted]
    for attempts in resumed:
        assert attempts[-2].outcome == "infra_failure"
        assert attempts[-2].reason.startswith("orchestrator stopped")
        assert attempts[-1].start_step == (attempts[-1].resumed_from_step or 0) + 1
    # At least one interrupted trial continued from a checkpoint rather than from scratch.
    assert any(a[-1].resumed_from_step and a[-1].resumed_from_step >= 10 for a in resumed)


# k3 KL is exactly 0 with a deterministic rollout and > 0 otherwise: this rule makes the
# non-deterministic trial collapse at step 5 on the real simulator, the other stays healthy.
MISMATCH_RULE = """\
collapse:
  rules: [{name: any_mismatch, metric: rollout_corr/k3_kl, kind: above, threshold: 0.0, patience: 3, min_step: 5}]
early_stop: {margin: 0}
"""


@pytest.mark.slow
def test_killed_worker_is_retried_from_checkpoint_collapse_is_not(setup) -> None:
    tmp, (c, _nodes) = setup
    # 150 steps for a kill at step >= 17: on a fast machine a 40-step tiny trial ends before a
    # polling thread sharing the GIL with the scheduler sees step 17 (CI missed it once).
    path = write_grid(tmp / "g.yaml", "faults", steps=150, seeds=[0], levels=["token"], pools=["sim-a100"],
                 axes="  rollout.deterministic: [true, false]\n", budget="{max_parallel: 2}",
                 extra=MISMATCH_RULE)
    grid_dir = tmp / ".ablate" / "faults"
    killed: dict = {}

    def killer() -> None:
        deadline = time.time() + 180
        while time.time() < deadline and not killed:
            specs = list((grid_dir / "trials").glob("*/spec.json")) if (grid_dir / "trials").exists() else []
            for spec in specs:
                root = spec.parent
                s = json.loads(spec.read_text())
                running = root / "running.json"
                if dict(s["axes"]).get("rollout.deterministic") != "true" or not running.exists():
                    continue
                if sum(1 for _ in records.iter_metrics(root / "metrics.jsonl")) >= 17:
                    pid = json.loads(running.read_text())["pid"]
                    os.kill(pid, signal.SIGKILL)
                    killed.update(trial=s["trial_id"], pid=pid)
                    return
            time.sleep(0.02)

    summary = submit_while(path, c.address, killer)
    assert killed, "the worker was never killed"
    trials = read_trials(grid_dir)
    victim = trials[killed["trial"]]
    outcomes = [(a.outcome, a.resumed_from_step) for a in victim["attempts"]]
    assert len(outcomes) == 2 and outcomes[1][0] == "completed", outcomes
    # Resumed from the newest checkpoint (every 5 steps) the killed attempt had saved: killed at
    # step >= 17 (how far past depends on the machine's load), never from scratch.
    died_at = victim["attempts"][0].end_step
    assert died_at >= 17 and outcomes[1][1] in (5 * (died_at // 5), 5 * (died_at // 5) - 5), (died_at, outcomes)
    assert victim["attempts"][1].start_step == outcomes[1][1] + 1
    assert victim["attempts"][0].outcome == "infra_failure"
    assert "worker process died" in victim["attempts"][0].reason
    assert victim["state"].verdict["kind"] == "healthy"
    assert victim["steps"] == list(range(1, 151))
    assert mlflow_steps(summary["tracking_uri"], victim["state"].mlflow_run_id,
                         "critic/score/mean") == list(range(1, 151))
    collapsed = next(t for tid, t in trials.items() if tid != killed["trial"])
    assert collapsed["state"].verdict["kind"] == "collapsed"
    assert [a.outcome for a in collapsed["attempts"]] == ["stopped_early"]  # a result: no retry
    assert summary["verdicts"] == {"healthy": 1, "collapsed": 1}


def test_cancel_a_pool_of_a_running_grid(setup, double) -> None:
    tmp, (c, _nodes) = setup
    path = write_grid(tmp / "g.yaml", "cancelme", steps=60, seeds=[0, 1], levels=["token"],
                 pools=["sim-h100", "sim-h20"], budget="{max_parallel: 4}")
    grid_dir = tmp / ".ablate" / "cancelme"
    asked: dict = {}

    def canceller() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            ts = read_trials(grid_dir) if (grid_dir / "trials").exists() else {}
            if any(t["spec"]["pool"] == "sim-h20" and len(t["steps"]) >= 3 for t in ts.values()):
                asked["n"] = scheduler.cancel("cancelme", pool="sim-h20")
                return
            time.sleep(0.1)

    summary = submit_while(path, c.address, canceller)
    assert asked["n"] == 2
    trials = read_trials(grid_dir)
    for t in trials.values():
        if t["spec"]["pool"] == "sim-h20":
            assert t["state"].state.value == "cancelled"
            assert len(t["steps"]) < 60  # the running one stopped, the queued one never ran
        else:
            assert t["state"].state.value == "done" and t["steps"] == list(range(1, 61))
    assert summary["states"] == {"done": 2, "cancelled": 2}
    assert records.cancel_requests(grid_dir) == {}


# IcePop-style masking (is_mode: mask) of an fp8 rollout: a band tighter than the mismatch
# masks tokens out of the update and learns less, a wide one keeps them all.
SEARCH_BASE = """\
overrides:
  correction.is_level: token
  correction.is_mode: mask
  rollout.dtype: fp8
  train.lr: 1.0e-2
  train.prompts_per_step: 8
  train.group_size: 4
  train.minibatches: 1
  eval.every: 10
  eval.prompts: 32
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
collapse: {rules: none}
checkpoint: {every: 10}
"""


@pytest.mark.slow
def test_optuna_search_of_the_is_upper_bound_beats_the_worst_grid_point(setup) -> None:
    tmp, (c, _nodes) = setup
    head = "recipe: sim/grpo_tiny\nbackend: sim\nsteps: 40\nseeds: [0]\npool: sim-h100\n"
    grid = tmp / "g.yaml"
    grid.write_text(f"name: is-grid\n{head}axes:\n  correction.is_bounds: [[0.999, 1.001], [null, 2.0]]\n"
                    f"budget: {{max_parallel: 2}}\n{SEARCH_BASE}")
    s = scheduler.submit(str(grid), address=c.address, progress=False)
    finals = [json.loads((Path(s["grid_dir"]) / "trials" / tid / "result.json").read_text())
              ["summary"]["eval/reward"] for tid in read_trials(Path(s["grid_dir"]))]
    worst = min(finals)
    search = tmp / "s.yaml"
    # The example: the IS upper bound in [1.5, 10] (lower bound null: 1/upper).
    base = SEARCH_BASE.replace("overrides:\n", "overrides:\n  correction.is_bounds: [null, 2.0]\n")
    search.write_text(f"name: is-search\n{head}budget: {{max_parallel: 2}}\n{base}"
                      "search:\n  params:\n    correction.is_bounds[1]: {low: 1.5, high: 10.0}\n"
                      "  budget: 4\n  objective: {metric: eval/reward/final, mode: max}\n")
    summary = scheduler.submit(str(search), address=c.address, progress=False)
    assert summary["trials"] == 4 and summary["states"] == {"done": 4}
    trials = read_trials(Path(summary["grid_dir"]))
    bounds = [dict(t["spec"]["overrides"])["correction.is_bounds"] for t in trials.values()]
    assert all(lo is None and 1.5 <= hi <= 10.0 for lo, hi in bounds), bounds
    assert len({hi for _, hi in bounds}) == 4  # four different points, four trials
    best = summary["search"]["best"]
    assert 1.5 <= best["params"]["correction.is_bounds[1]"] <= 10.0
    assert best["objective"] > worst + 0.01, (best, finals)
    # A second submit of the finished search runs nothing new.
    again = scheduler.submit(str(search), address=c.address, progress=False)
    assert again["trials"] == 4 and again["skipped_finished"] == 4


def test_resume_request_moves_a_finished_trial_to_another_pool(setup) -> None:
    """What `ablate resume` (issue 6) builds on: reopen a trial with a resume request."""
    from mlflow.tracking import MlflowClient

    from orchestrator.trial import TrialState, transition

    tmp, (c, nodes) = setup
    path = write_grid(tmp / "g.yaml", "moveme", steps=20, seeds=[0], levels=["token"], pools=["sim-h100"],
                 budget="{max_parallel: 1}", extra="collapse: {rules: none}\n")
    first = scheduler.submit(str(path), address=c.address, progress=False)
    grid_dir = Path(first["grid_dir"])
    (tid,) = read_trials(grid_dir)
    paths = TrialPaths(grid_dir, tid)
    rec = records.load_state(paths, tid)
    run_id = rec.mlflow_run_id
    rec.state = transition(rec.state, TrialState.PENDING, resume=True)
    rec.resume = records.ResumeRequest(pool="sim-h20", start=15)  # keep: 2 leaves steps 15 and 20
    records.save_state(paths, rec)
    second = scheduler.submit(str(path), address=c.address, progress=False)
    assert second["states"] == {"done": 1}, records.load_state(paths, tid).error  # why, if not
    t = read_trials(grid_dir)[tid]
    a1, a2 = t["attempts"]
    assert (a1.pool, a1.node, a1.outcome) == ("sim-h100", nodes["sim-h100"], "completed")
    assert (a2.pool, a2.node, a2.resumed_from_step, a2.start_step, a2.end_step) == (
        "sim-h20", nodes["sim-h20"], 15, 16, 20)
    assert t["state"].resume is None and t["state"].superseded_runs == [run_id]
    assert t["steps"] == list(range(1, 21))
    # MLflow: MLflow held steps 16-20 already, so the run was replaced by one refilled from
    # metrics.jsonl (one value per step, the resumed attempt's); the old one is soft-deleted.
    mlc = MlflowClient(second["tracking_uri"])
    new_id = t["state"].mlflow_run_id
    assert new_id != run_id and mlc.get_run(run_id).info.lifecycle_stage == "deleted"
    assert mlc.get_run(run_id).data.tags["superseded_by"] == new_id
    hist = mlc.get_metric_history(new_id, "critic/score/mean")
    want = {s: m["critic/score/mean"] for s, m in records.iter_metrics(paths.metrics)}
    assert sorted(m.step for m in hist) == list(range(1, 21))
    assert {m.step: m.value for m in hist} == pytest.approx(want)
    assert mlc.get_run(new_id).data.tags["pool_steps"] == "sim-h100:1-15,sim-h20:16-20"


# The rescue tests' warning and switch (``warnrescue``), with the rescue moved to another
# pool's node.
RESCUE_GRID = ("name: rescue-on-cluster\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 12\n"
               "seeds: [0]\naxes:\n  pool: [sim-a100]\ncheckpoint: {every: 2, keep: 3}\n"
               + SECTIONS + rescue("sim-h100"))


@pytest.mark.slow
def test_a_warning_rescue_runs_on_the_rescue_pools_node_of_a_ray_cluster(setup) -> None:
    """The rescue policy on a Ray cluster: the parent stops at the warning on sim-a100's node,
    its rescue runs on sim-h100's node from the checkpoint before the warning, in one submit."""
    tmp, (c, nodes) = setup
    path = tmp / "rescue.yaml"
    path.write_text(RESCUE_GRID)
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    got = read_trials(Path(summary["grid_dir"]))
    (parent,) = [t for t in got.values() if not t["state"].rescue_of]
    (child,) = [t for t in got.values() if t["state"].rescue_of]
    assert summary["rescued"] == [child["spec"]["trial_id"]], summary
    assert {t["state"].state.value for t in got.values()} == {"done"}
    (stopped,) = parent["attempts"]
    assert (stopped.pool, stopped.node, stopped.outcome, stopped.end_step) == (
        "sim-a100", nodes["sim-a100"], "stopped_early", 4)
    (note,) = parent["state"].rescues
    assert (note["event"], note["step"], note["start"], note["pool"]) == (
        "warning:k3_warn", 3, 2, "sim-h100")
    inherited, ran = child["attempts"]
    assert (inherited.outcome, inherited.end_step) == ("inherited", 2)
    assert (ran.pool, ran.node, ran.resumed_from_step, ran.end_step) == (
        "sim-h100", nodes["sim-h100"], 2, 12)
    k3 = {s: m[K3] for s, m in records.iter_metrics(child["paths"].metrics)}
    assert max(k3[s] for s in range(4, 13)) < THRESHOLD, k3


def test_infra_failures_exhaust_retries_and_fail_the_trial(setup, double) -> None:
    from mlflow.tracking import MlflowClient

    tmp, (c, _nodes) = setup
    path = write_grid(tmp / "g.yaml", "doomed", steps=20, seeds=[0], levels=["token"], pools=["sim-h20"],
                 budget="{max_parallel: 1}", extra="", tiny=False)
    path.write_text(path.read_text().replace("retries: {max: 2}", "retries: {max: 1}")
                    + "overrides: {train.lr: 0.0666}\n")
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    assert summary["states"] == {"failed": 1}
    (t,) = read_trials(Path(summary["grid_dir"])).values()
    assert [(a.outcome, a.start_step, a.end_step) for a in t["attempts"]] == [
        ("infra_failure", 1, 6), ("infra_failure", 6, 6)]  # retried once, from the step-5 checkpoint
    assert "retries exhausted after 2 attempts" in t["state"].error and "injected" in t["state"].error
    assert t["state"].verdict["kind"] == "infra_failure"
    run = MlflowClient(summary["tracking_uri"]).get_run(t["state"].mlflow_run_id)
    assert run.info.status == "FAILED" and run.data.tags["verdict"] == "infra_failure"
    assert summary["failed"][0]["trial_id"] == t["spec"]["trial_id"]
