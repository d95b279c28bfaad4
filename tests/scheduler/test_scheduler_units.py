"""Scheduler pieces that need no Ray cluster: pool placement rules, the gate's limits and
reasons, the search objective, status/cancel errors, the progress view."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.exceptions import UserError
from orchestrator.pools import load_catalog
from orchestrator.scheduler import _progress as progress
from orchestrator.scheduler import cancel, status_command
from orchestrator.scheduler._gate import PoolGate
from orchestrator.scheduler._placement import plan_placement
from orchestrator.scheduler._search import objective_value
from orchestrator.schema import SearchObjective
from orchestrator.store import TrialPaths, records
from orchestrator.trial import TrialSpec, TrialState


def _pools(*names: str):
    cat = load_catalog()
    return {n: cat.get(n) for n in names}


def test_embedded_placement_uses_pool_resources_and_refuses_gpu_pools() -> None:
    pl = plan_placement(_pools("sim-h100", "h100"), embedded=True, cluster_resources={},
                        node_labels=[])
    assert dict(pl["sim-h100"].resources) == {"CPU": 1.0, "pool:sim-h100": 1.0}
    assert pl["sim-h100"].capacity == 2 and pl["sim-h100"].reason is None
    assert pl["h100"].capacity == 0 and "GPU pool" in pl["h100"].reason


def test_cluster_placement_prefers_pool_resource_then_accelerator_type_then_label() -> None:
    pools = _pools("sim-a100", "h100", "h20", "a100", "l20")
    pl = plan_placement(pools, embedded=False, cluster_resources={
        "CPU": 64, "pool:sim-a100": 3, "accelerator_type:H100": 2},
        node_labels=[{"ray.io/accelerator-type": "H20"}])
    assert pl["sim-a100"].capacity == 3 and "pool:sim-a100" in pl["sim-a100"].resources
    assert pl["h100"].resources["accelerator_type:H100"] == pytest.approx(0.001)
    assert pl["h20"].label_selector == {"ray.io/accelerator-type": "H20"}
    for name in ("a100", "l20"):  # nothing in the cluster advertises them: pending, with reason
        assert pl[name].capacity == 0
        assert "no node of the Ray cluster advertises" in pl[name].reason


def _trial(tid: str, pool: str) -> TrialSpec:
    return TrialSpec(trial_id=tid, grid="g", backend="sim", recipe="sim/grpo_tiny", pool=pool,
                     seed=0, steps=10, axes=(("pool", pool),), overrides=())


def test_gate_respects_grid_and_pool_limits_without_head_of_line_blocking(tmp_path: Path) -> None:
    queue = [_trial("a1", "A"), _trial("a2", "A"), _trial("a3", "A"), _trial("b1", "B")]
    gate = PoolGate(tmp_path, queue, {"A": 1, "B": 1}, max_parallel=3)
    first = gate.suggest("x1")
    second = gate.suggest("x2")  # A is full: B's trial goes ahead of a2/a3
    assert first["trial_id"] == "a1" and second["trial_id"] == "b1"
    assert gate.suggest("x3") is None  # both pools full
    reasons = gate.reasons()
    assert reasons["a2"] == "queued: pool A full (1/1 running)"
    assert reasons["a1"] == "starting on pool A"
    gate.on_trial_complete("x1", {"state": "done"})
    assert gate.suggest("x4")["trial_id"] == "a2"
    gate.on_trial_complete("x2", None, error=True)
    assert gate.errors == {"b1"}
    gate.on_trial_complete("x4", {})
    assert gate.suggest("x5")["trial_id"] == "a3"
    assert gate.suggest("x6") == PoolGate.FINISHED


def test_gate_skips_trials_cancelled_while_queued(tmp_path: Path) -> None:
    t = _trial("c1", "A")
    paths = TrialPaths(tmp_path, "c1")
    records.save_state(paths, records.TrialRecord(trial_id="c1", state=TrialState.CANCELLED))
    gate = PoolGate(tmp_path, [t], {"A": 1}, max_parallel=1)
    assert gate.suggest("x") == PoolGate.FINISHED


def test_objective_penalises_collapse() -> None:
    obj = SearchObjective(metric="eval/reward/final", mode="max", collapse_penalty=1.0)
    healthy = {"summary": {"eval/reward": 0.4}, "verdict": {"kind": "healthy"}}
    collapsed = {"summary": {"eval/reward": 0.4}, "verdict": {"kind": "collapsed"}}
    assert objective_value(healthy, obj) == pytest.approx(0.4)
    assert objective_value(collapsed, obj) == pytest.approx(-0.6)
    assert objective_value({"summary": {}, "verdict": {"kind": "numeric_failure"}}, obj) == -1.0


def _fake_grid(root: Path) -> Path:
    grid_dir = root / "g1"
    for tid, pool, state in (("t1", "sim-h100", TrialState.DONE), ("t2", "sim-a100", TrialState.PENDING)):
        paths = TrialPaths(grid_dir, tid)
        records.save_spec(paths, _trial(tid, pool))
        records.save_state(paths, records.TrialRecord(trial_id=tid, state=state, pool=pool,
                                                      pending_reason="not started: no capacity"
                                                      if state is TrialState.PENDING else None))
    with open(TrialPaths(grid_dir, "t1").metrics, "w") as fh:
        fh.write(records.metric_line(10, {"eval/reward": 0.5, "rollout_corr/k3_kl": 1e-3}))
    return grid_dir


def test_status_and_cancel_without_an_orchestrator(tmp_path: Path, capsys) -> None:
    _fake_grid(tmp_path)
    assert status_command("g1", workdir=str(tmp_path), as_json=True) == 0
    view = json.loads(capsys.readouterr().out)
    by_id = {t["trial_id"]: t for t in view["trials"]}
    assert by_id["t1"]["step"] == 10 and by_id["t1"]["reward"] == 0.5
    assert by_id["t2"]["note"] == "not started: no capacity"
    with pytest.raises(UserError, match="no trial 't11'; did you mean 't1'"):
        cancel("g1", trials=["t11"], workdir=str(tmp_path))
    with pytest.raises(UserError, match="did you mean 'sim-a100'"):
        cancel("g1", pool="sim-a10", workdir=str(tmp_path))
    with pytest.raises(UserError, match="grid 'nope' has no runs"):
        status_command("nope", workdir=str(tmp_path))
    assert cancel("g1", workdir=str(tmp_path)) == 1  # only the unfinished one
    rec = records.load_state(TrialPaths(tmp_path / "g1", "t2"), "t2")
    assert rec.state is TrialState.CANCELLED
    assert records.cancel_requests(tmp_path / "g1") == {}  # nobody runs it: done at once


def test_progress_eta_from_running_rates(tmp_path: Path) -> None:
    view = progress.GridView("g", str(tmp_path), [
        progress.TrialView("a", "p", 100, "running", step=50, rate=5.0),
        progress.TrialView("b", "p", 100, "pending"),
        progress.TrialView("c", "p", 100, "done", step=100)], None, None)
    assert progress._eta(view.trials) == pytest.approx((50 + 100) / 5.0)


def test_gate_stages_one_standby_trial_beyond_a_saturated_pool(tmp_path: Path) -> None:
    queue = [_trial(f"a{i}", "A") for i in range(4)]
    gate = PoolGate(tmp_path, queue, {"A": 2}, max_parallel=2, standby={"A": 1})
    assert [gate.suggest(f"x{i}")["trial_id"] for i in range(3)] == ["a0", "a1", "a2"]
    assert gate.suggest("x3") is None  # limit 2 + 1 standby (Ray runs 2: pool:A has 2 units)
    gate.on_trial_complete("x0", {})
    assert gate.suggest("x4")["trial_id"] == "a3"


def test_standby_only_where_ray_enforces_the_limit_and_the_grid_limit_is_not_binding() -> None:
    from orchestrator.scheduler._placement import standby_slots

    pl = plan_placement(_pools("sim-a100", "h100"), embedded=False, cluster_resources={
        "CPU": 8, "pool:sim-a100": 2, "accelerator_type:H100": 2}, node_labels=[])
    assert pl["sim-a100"].enforced and not pl["h100"].enforced  # 0.001 of accelerator_type each
    assert standby_slots(pl, {"sim-a100": 2, "h100": 1}, max_parallel=3) == {"sim-a100": 1}
    assert standby_slots(pl, {"sim-a100": 1, "h100": 1}, max_parallel=3) == {}  # per_pool below capacity
    assert standby_slots(pl, {"sim-a100": 2, "h100": 1}, max_parallel=2) == {}  # max_parallel binds


def test_reap_stale_sessions_stops_only_orphaned_agents_of_its_temp_root(tmp_path: Path) -> None:
    import subprocess
    import time

    from orchestrator.scheduler._placement import reap_stale_sessions

    def agent(root: Path) -> subprocess.Popen:
        logs = root / "session_2026-01-01_00-00-00_1_1" / "logs"
        logs.mkdir(parents=True)
        # A process titled like Ray's agent, with its log open in the session directory (its
        # parent is this test, not a raylet: like an agent whose raylet died).
        return subprocess.Popen(["bash", "-c", f"exec -a ray::DashboardAgent sleep 60 3>>{logs}/a.log"])

    stale, other = agent(tmp_path / "ray"), agent(tmp_path / "elsewhere")
    try:
        time.sleep(0.3)
        assert reap_stale_sessions(tmp_path / "ray", grace_s=1.0) == [stale.pid]
        assert stale.wait(timeout=5) is not None
        assert other.poll() is None  # another temp root: not ours to stop
    finally:
        for p in (stale, other):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_local_node_ray_gave_up_on_is_stopped_and_started_again(monkeypatch) -> None:
    """Ray waits a fixed 30 s for its raylet (ray/_private/node.py); on a busy host it gives up
    with a bare Exception and leaves the processes it started. Those are stopped and the node
    started again; after the last try the user gets one line. (Ray's start is the double here:
    an overloaded host cannot be made on demand.)"""
    import subprocess

    import ray

    from orchestrator.scheduler._placement import _start_local

    started: list[subprocess.Popen] = []

    def slow_init(fail: int):
        def init(**kwargs):
            started.append(subprocess.Popen(["sleep", "60"]))  # a half-started raylet
            if len(started) <= fail:
                raise Exception("The current node timed out during startup. This could happen "
                                "because some of the raylet failed to startup or the GCS has "
                                "become overloaded.")
        return init

    try:
        monkeypatch.setattr(ray, "init", slow_init(fail=1))
        _start_local(attempts=3, num_cpus=1)
        assert len(started) == 2
        assert started[0].wait(timeout=5) is not None  # the failed start's process is gone
        assert started[1].poll() is None  # the node that started is left alone
        started[1].kill()
        started.clear()
        monkeypatch.setattr(ray, "init", slow_init(fail=3))
        with pytest.raises(UserError, match=r"did not start \(3 tries.*--address"):
            _start_local(attempts=3, num_cpus=1)
        assert len(started) == 3 and all(p.wait(timeout=5) is not None for p in started)
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_another_ray_start_error_is_not_retried(monkeypatch) -> None:
    import ray

    from orchestrator.scheduler._placement import _start_local

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise ValueError("bad resources")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ValueError, match="bad resources"):
        _start_local(attempts=3, num_cpus=1)
    assert len(calls) == 1


def test_truncate_metrics_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(records.metric_line(1, {"m": 1.0}) + '{"step": 2, "metr')
    assert records.truncate_metrics(path, 5) == [(1, {"m": 1.0})]
    with open(path, "a") as fh:
        fh.write(records.metric_line(2, {"m": 2.0}))
    assert [s for s, _ in records.iter_metrics(path)] == [1, 2]


SEARCH_GRID = """\
name: s
recipe: sim/grpo_tiny
backend: sim
steps: 10
seeds: [0]
pool: sim-h100
overrides:
  correction.is_level: token
{extra}search:
  params:
    {key}: {{low: {low}, high: 10.0}}
  budget: 2
"""


def test_search_over_one_bound_of_a_list_valued_key(isolated: Path) -> None:
    from orchestrator.exceptions import GridError
    from orchestrator.grid import load_grid, search_trial

    path = isolated / "s.yaml"
    path.write_text(SEARCH_GRID.format(key="correction.is_bounds[1]", low=1.5,
                                       extra="  correction.is_bounds: [null, 2.0]\n"))
    grid = load_grid(path)
    trial = search_trial(grid, {"correction.is_bounds[1]": 3.5}, {}, 0)
    assert dict(trial.overrides)["correction.is_bounds"] == (None, 3.5)
    assert ("correction.is_bounds[1]", "3.5") in trial.axes
    # Plan-time checks: the range must keep the bounds valid, the list must exist.
    path.write_text(SEARCH_GRID.format(key="correction.is_bounds[1]", low=0.2, extra=""))
    with pytest.raises(GridError, match=r"at 0.2, is_bounds lower bound 0.5 is above the upper bound"):
        load_grid(path)
    path.write_text(SEARCH_GRID.format(key="correction.rs_bounds[0]", low=0.2, extra=""))
    with pytest.raises(GridError, match="rs_bounds is null, which has no element 0"):
        load_grid(path)
