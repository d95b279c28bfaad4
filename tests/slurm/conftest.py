"""The session's Slurm clusters: ``slurm_cluster`` (``cluster.py``, two nodes, no accounting)
and ``slurm_accounting`` (``accounting.py``: MariaDB + slurmdbd + a one-node cluster enforcing
associations and QOS), each started once for the tests that ask for it and stopped by pid at
the end of the session; the tests are skipped with the reason where one cannot start (not root,
Slurm or slurmdbd/MariaDB not installed)."""
from __future__ import annotations

import os
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
    before = os.environ.get("SLURM_CONF")
    try:
        c.start()
        os.environ["SLURM_CONF"] = str(c.conf)  # the backend's checks in this process
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before


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
