"""Fixtures of the reliability suite: a real local multi-raylet Ray cluster (one pool per node,
as in ``tests/scheduler/test_scheduler.py``) and the deterministic double backend of
``tests/doubles.py``.

Ray workers and the orchestrator subprocesses the tests SIGKILL import ``doubles`` from
``tests/`` and ``relbackends`` from ``tests/reliability/``: both are on PYTHONPATH while the
cluster lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rayclusters import pool_cluster

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
POOL_NODES = {"sim-h100": 2, "sim-a100": 2}  # pool -> capacity (= CPUs of its node)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[object, dict[str, str]]]:
    """A head without CPUs plus one raylet per pool; yields (Cluster, {pool: node_id})."""
    with pool_cluster(list(POOL_NODES.items()), extra_paths=[TESTS, HERE],
                      env={"ABLATE_DOUBLE_STEP_S": "0.05"}) as (c, started):
        yield c, {pool: node.node_id for pool, node in zip(POOL_NODES, started)}


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend ``sim`` resolves to the deterministic double (driver and Ray workers)."""
    import doubles

    doubles.register(monkeypatch)
