"""A Ray node lost mid-trial on a local multi-raylet cluster.

Two raylets advertise the same pool (``pool:sim-h100``, one CPU each); while both trials of the
grid run, the node running one of them is removed (``Cluster.remove_node``: its raylet and every
worker on it are killed, as when a machine drops out). The trial must be retried by Tune on the
surviving node from its last checkpoint, with the lost attempt recorded as an infra failure and
its reason, end exactly once, and have steps 1..N exactly once on disk and in MLflow. The other
trial must not notice. Own module: the test changes its cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import relhelpers as H
from rayclusters import pool_cluster, submit_while

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
STEPS = 30


@pytest.fixture
def twin_cluster() -> Iterator[tuple[object, dict[str, object]]]:
    with pool_cluster([("sim-h100", 1), ("sim-h100", 1)], extra_paths=[TESTS, HERE]) as (c, started):
        yield c, {node.node_id: node for node in started}


@pytest.mark.slow
def test_node_lost_mid_trial_is_retried_on_another_node_exactly_once(
    isolated: Path, twin_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import backends

    c, nodes = twin_cluster
    monkeypatch.setitem(backends._TRAINERS, "sim", ("relbackends", "PacedDouble"))
    path = H.write_grid(
        isolated / "g.yaml",
        "nodeloss",
        steps=STEPS,
        seeds=[0, 1],
        levels=["token"],
        pools=["sim-h100"],
        tiny=False,
        extra="collapse: {rules: none}\n",
    )
    grid_dir = isolated / ".ablate" / "nodeloss"
    grid_dir.mkdir(parents=True)
    (grid_dir / "double_step_s").write_text("0.15")
    lost: dict = {}

    def remove_a_busy_node() -> None:
        deadline = time.time() + 180
        while time.time() < deadline:
            for run in grid_dir.glob("trials/*/running.json"):
                root = run.parent
                try:
                    node_id = json.loads(run.read_text())["node"]
                except (OSError, ValueError, KeyError):
                    continue
                if (
                    sum(1 for _ in root.joinpath("metrics.jsonl").open()) >= 12
                    and node_id in nodes
                ):
                    c.remove_node(nodes[node_id], allow_graceful=False)
                    lost.update(trial=root.name, node=node_id, at=time.time())
                    return
            time.sleep(0.05)

    summary = submit_while(path, c.address, remove_a_busy_node)
    assert lost, "no node was removed"
    assert summary["states"] == {"done": 2} and summary["verdicts"] == {"healthy": 2}, summary
    counts = H.check_exactly_once(
        grid_dir, summary["tracking_uri"], steps=STEPS, keys=("critic/score/mean", "acc")
    )
    assert counts["trials"] == 2
    trials = H.trials(grid_dir)
    first, second = trials[lost["trial"]]["attempts"]
    assert first.node == lost["node"] and first.outcome == "infra_failure"
    assert first.reason == "worker process died without a record (killed, OOM or node lost)"
    (survivor,) = set(nodes) - {lost["node"]}
    assert second.node == survivor and second.outcome == "completed"
    assert (
        second.resumed_from_step in (10, 15) and second.start_step == second.resumed_from_step + 1
    )
    (other,) = set(trials) - {lost["trial"]}
    assert [a.outcome for a in trials[other]["attempts"]] == ["completed"]
