"""Fixtures for the simulator tests: a resolved sim config and an in-memory RunContext.

The real RunContext (orchestrator.run) is tested on its own; these tests only need one that
keeps metrics in memory and checkpoints under tmp_path (``orchestrator.sim.local.LocalContext``).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator import recipes
from orchestrator.backends.base import AttemptResult
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.pools import PoolSpec, load_catalog
from orchestrator.sim.job import SimTrainer
from orchestrator.sim.local import LocalContext, make_trial

# Small batches: these tests check behaviour, not learning.
FAST = {"train.prompts_per_step": 4, "train.group_size": 4, "train.minibatches": 2,
        "eval.every": 3, "eval.prompts": 8}
TIMING = ("perf/", "timing_s/")


def sim_config(overrides: Mapping[str, Any] = {}, recipe: str = "sim/grpo_tiny") -> dict[str, Any]:
    """Recipe + overrides, with the correction/rollout sections filled as grid.py does."""
    base = recipes.compose_recipe(recipe, root=recipes.REPO_RECIPES)
    for section, model in (("correction", CorrectionSpec), ("rollout", RolloutSpec)):
        base[section] = {**model().model_dump(mode="json"), **(base.get(section) or {})}
    return recipes.apply_overrides(base, {**FAST, **overrides})


def pool(name: str, **profile: Any) -> PoolSpec:
    spec = load_catalog().get(name)
    if profile:
        spec = spec.model_copy(update={"sim_profile": {**spec.sim_profile, **profile}})
    return spec


def run(tmp: Path, pool_spec: PoolSpec, steps: int, overrides: Mapping[str, Any] = {}, *,
        seed: int = 0, every: int = 0, resume: int | None = None,
        stop_at: int | None = None) -> tuple[AttemptResult, LocalContext]:
    trial = make_trial(pool_spec.name, steps, seed, overrides)
    ctx = LocalContext(trial=trial, pool=pool_spec, workdir=tmp, checkpoint_every=every,
                       resume_step=resume, stop_at=stop_at)
    return SimTrainer().run(trial, sim_config(overrides), ctx), ctx


def no_timing(metrics: Mapping[int, Mapping[str, float]]) -> dict[int, dict[str, float]]:
    """Metrics without wall-clock timings (the only values that may differ between runs)."""
    return {s: {k: v for k, v in m.items() if not k.startswith(TIMING)} for s, m in metrics.items()}


class SimHarness:
    """The helpers above, handed to tests as the ``sim`` fixture."""

    config = staticmethod(sim_config)
    pool = staticmethod(pool)
    run = staticmethod(run)
    no_timing = staticmethod(no_timing)


@pytest.fixture(scope="session")
def sim() -> SimHarness:
    import torch

    torch.set_num_threads(1)  # the machine is shared: 1-thread trials side by side
    return SimHarness()
