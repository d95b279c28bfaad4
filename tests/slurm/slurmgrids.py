"""Grids and pools for the Slurm tests: two emulated-hardware sim pools, one per partition of
the test cluster (``cluster.NODES``), and readers of what a run left."""
from __future__ import annotations

from pathlib import Path

POOLS = """pools:
  slurm-h100:
    kind: sim
    accelerator: H100 (emulated) on partition pa
    capacity: 2
    sim_profile: {dtype: bf16, lm_head: bf16, kv_cache: fp8, reduction_order: chunked}
    slurm: {partition: pa, gres: "gpu:h100:1", time_limit: "10"}
  slurm-a100:
    kind: sim
    accelerator: A100 (emulated) on partition pb
    capacity: 2
    sim_profile: {dtype: bf16, lm_head: fp8, kv_cache: fp8, reduction_order: chunked}
    slurm: {partition: pb, constraint: fb}
"""


def write_grid(root: Path, name: str, *, steps: int, pools: list[str], seeds: list[int],
               every: int, extra_pools: str = "", extra: str = "") -> Path:
    (root / "pools.yaml").write_text(POOLS + extra_pools)
    path = root / f"{name}.yaml"
    path.write_text(f"name: {name}\nrecipe: sim/grpo_tiny\nbackend: slurm\n"
                    f"pool_catalog: pools.yaml\nsteps: {steps}\nseeds: {seeds}\n"
                    f"axes:\n  pool: {pools}\ncheckpoint: {{every: {every}}}\n"
                    "budget: {max_parallel: 2}\n" + extra)
    return path


def job_ids(trial_root: Path) -> list[str]:
    """The Slurm job of each attempt of a trial, in attempt order."""
    dirs = sorted((trial_root / "logs").glob("slurm-attempt-*"),
                  key=lambda d: int(d.name.rsplit("-", 1)[1]))
    return [(d / "job-id").read_text().strip() for d in dirs if (d / "job-id").exists()]
