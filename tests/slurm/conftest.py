"""The session's Slurm cluster (``cluster.py``): started once for every test that asks for it,
stopped by pid at the end of the session; the tests are skipped with the reason where it cannot
start (not root, Slurm not installed)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cluster, slurmgrids

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
