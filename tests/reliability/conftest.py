"""Fixtures of the reliability suite: a real local multi-raylet Ray cluster (one pool per node,
as in ``tests/test_scheduler.py``) and the deterministic double backend of ``tests/doubles.py``.

Ray workers and the orchestrator subprocesses the tests SIGKILL import ``doubles`` from
``tests/`` and ``relbackends`` from ``tests/reliability/``: both are on PYTHONPATH while the
cluster lives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
POOL_NODES = {"sim-h100": 2, "sim-a100": 2}  # pool -> capacity (= CPUs of its node)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[object, dict[str, str]]]:
    """A head without CPUs plus one raylet per pool; yields (Cluster, {pool: node_id})."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths have a length cap
    keys = ("RAY_TMPDIR", "PYTHONPATH", "ABLATE_DOUBLE_STEP_S")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["RAY_TMPDIR"] = tmp
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS), str(HERE), saved["PYTHONPATH"]])
    )
    os.environ["ABLATE_DOUBLE_STEP_S"] = "0.05"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = {}
    for pool, cap in POOL_NODES.items():
        node = c.add_node(num_cpus=cap, resources={f"pool:{pool}": cap}, labels={"pool": pool})
        nodes[pool] = node.node_id
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend ``sim`` resolves to the deterministic double (driver and Ray workers)."""
    import doubles

    doubles.register(monkeypatch)
