"""``ablate probe`` of a Slurm grid: each configuration's probe is a Slurm job on its pool's
partition, the jobs run in parallel within the grid's ``budget:`` (one at a time under
``max_parallel: 1``), and what they measure is what the same probe measures in this process.

Two sim pools on the session's cluster (``slurmgrids``: slurm-h100 on partition pa, node n1;
slurm-a100 on pb, n2); each job a few seconds.
"""
from __future__ import annotations

import json
from pathlib import Path

import cliproc
import pytest
from slurmgrids import write_grid

from orchestrator.probe import probe
from orchestrator.probe._report import TIME_COLUMNS

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

PLACE = {"slurm-h100": ("pa", "n1"), "slurm-a100": ("pb", "n2")}


def _records(workdir: Path) -> dict[str, dict]:
    """The probe records a probe kept, by pool: ``<workdir>/probes/<id>.json``."""
    out = {}
    for path in (workdir / "probes").glob("p*.json"):
        record = json.loads(path.read_text())
        out[record["identity"]["pool"]] = record
    return out


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows]


def _probe(root: Path, cluster, *, max_parallel: int) -> tuple[dict[str, dict], str]:
    root.mkdir(parents=True)
    grid = write_grid(root, "slurm-probe", steps=4, pools=list(PLACE), seeds=[0], every=2)
    grid.write_text(grid.read_text().replace("max_parallel: 2", f"max_parallel: {max_parallel}"))
    with cliproc.ablate_env(root, cluster.env) as env:
        res = cliproc.run(["probe", str(grid), "--batches", "2", "--out", str(root / "out")],
                          env, root, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return _records(root / ".ablate"), res.stdout


def test_each_configuration_is_a_slurm_job_on_its_partition_in_parallel(
        tmp_path: Path, slurm_cluster) -> None:
    records, out = _probe(tmp_path / "two", slurm_cluster, max_parallel=2)
    assert sorted(records) == sorted(PLACE), out
    for pool, record in records.items():
        partition, node = PLACE[pool]
        ran = record["ran_on"]
        assert (ran["partition"], ran["node"]) == (partition, node), record
        shown = slurm_cluster.run(["scontrol", "-o", "show", "job", ran["slurm_job_id"]])
        assert f"Partition={partition} " in shown and "JobState=COMPLETED" in shown, shown
    a, b = (r["ran_on"] for r in records.values())
    assert a["started"] < b["ended"] and b["started"] < a["ended"], (a, b)  # both at once
    # The same probe in this process (the local launcher's way) measures the same rows.
    grid = tmp_path / "two" / "slurm-probe.yaml"
    local_grid = grid.with_name("local-probe.yaml")
    local_grid.write_text(grid.read_text().replace("backend: slurm", "backend: sim"))
    here = probe(str(local_grid), batches=2, track=False, workdir=str(tmp_path / "here"),
                 out=str(tmp_path / "here-out"))
    local = _records(tmp_path / "here")
    assert not any(s.measured.cached for s in here.summaries)
    for pool, record in records.items():
        assert local[pool]["ran_on"]["slurm_job_id"] is None
        assert _untimed(record["rows"]) == _untimed(local[pool]["rows"]), pool
        assert record["engine"] == local[pool]["engine"], pool
    # The grid's budget: max_parallel 1 runs the two jobs one after the other.
    records, _ = _probe(tmp_path / "one", slurm_cluster, max_parallel=1)
    first, second = sorted((r["ran_on"] for r in records.values()), key=lambda r: r["started"])
    assert first["ended"] <= second["started"], (first, second)
