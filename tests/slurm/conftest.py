"""The session's Slurm clusters: ``slurm_cluster`` (``cluster.py``, two nodes, no accounting)
and ``slurm_accounting`` (``accounting.py``: MariaDB + slurmdbd + a one-node cluster enforcing
associations and QOS), each started once for the tests that ask for it and stopped by pid at
the end of the session; the tests are skipped with the reason where one cannot start (not root,
Slurm or slurmdbd/MariaDB not installed)."""
from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cluster, slurmgrids

import accounting
import cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[cluster.Cluster]:
    reason = cluster.missing()
    if reason:
        pytest.skip(reason)
    c = cluster.Cluster(Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp")))
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _slurm_conf(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SLURM_CONF`` at the test cluster for the length of each test that uses it (the backend's
    checks in this process read it), never longer: a worker that ran one of these goes on to
    other directories' tests, which must see the machine's environment (CI's stop 47 planned the
    README's Slurm grids against this cluster's partitions)."""
    if "slurm_cluster" in request.fixturenames:
        monkeypatch.setenv("SLURM_CONF", str(request.getfixturevalue("slurm_cluster").conf))


@pytest.fixture(scope="session")
def slurm_accounting() -> Iterator[accounting.Accounting]:
    reason = cluster.missing() or accounting.missing()
    if reason:
        pytest.skip(reason)
    acct = accounting.Accounting(Path(tempfile.mkdtemp(prefix="slurm-acct-", dir="/tmp")))
    try:
        acct.start()
        yield acct
    finally:
        acct.stop()
        shutil.rmtree(acct.root, ignore_errors=True)
