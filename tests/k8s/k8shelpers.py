"""Helpers shared by the Kubernetes tests: the example GPU grids, loaded and rendered once.

(A module of its own, not conftest.py: several conftest modules exist under tests/ and
`from conftest import ...` would pick whichever pytest imported first.)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # k8svalidate, kustomize helpers

REPO = Path(__file__).resolve().parents[2]
GPU_GRIDS = ("grids/seed_study.yaml", "grids/seed_study_14b.yaml")
IMAGE = "registry.test/rl-ablate/verl-sglang:0.9.1"


def settings(**kw: Any) -> Any:
    from orchestrator.k8s.settings import ClusterSettings

    return ClusterSettings(image=IMAGE, **kw)


@functools.cache
def loaded(grid_file: str) -> tuple[Any, list[Any]]:
    from orchestrator.grid import expand, load_grid

    grid = load_grid(REPO / grid_file, backend="k8s")
    return grid, expand(grid)


@functools.cache
def rendered(grid_file: str) -> list[tuple[Any, dict[str, Any]]]:
    """(trial, RayJob) for every trial of a grid, rendered with the default settings."""
    from orchestrator.k8s.render import render_rayjob

    grid, trials = loaded(grid_file)
    s = settings()
    return [
        (t, render_rayjob(t, grid.trial_config(t), grid.pools.pools[t.pool], settings=s))
        for t in trials
    ]
