"""The simulator's probe job as the trainer offers it (``backends.base.ProbeJob``): plan-time
questions torch-free, the batches in ``sim/probe.py``.

What decides a simulator configuration's step-1 mismatch: the rollout engine's resolved
arithmetic (the pool's profile with the grid's ``rollout.*`` flags, ``sim/profile.Numerics``),
the trainer's precision and routing replay (its recompute), the model and task, the batch
shape, the thread count and pinned numerics, and the simulator's version. The correction (but
routing replay) and the optimizer only act on the update a probe does not make.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from orchestrator.backends.base import ProbeJob
from orchestrator.backends.config import TrialConfig
from orchestrator.pools import PoolSpec
from orchestrator.sim.config import SimSetup, build_setup
from orchestrator.sim.job import SimTrainer, numeric_environment
from orchestrator.sim.profile import Numerics
from orchestrator.trial import TrialSpec

VERSION = "sim-probe-1"  # bump when a probe's numbers would change (part of its content hash)
# The exact (fp32 trainer) value of each engine knob.
EXACT: dict[str, Any] = {"dtype": "fp32", "lm_head": "fp32", "kv_cache": "fp32",
                         "router": "fp32", "weight_quant": "none", "reduction_order": "default",
                         "weight_lag": 0, "chunked_prefill": 0}
PRECISION_KNOB = "learner.precision"
LAG_KNOB = "engine.weight_lag"


def knobs(numerics: Numerics, precision: str | None, moe: bool) -> dict[str, str]:
    """The knobs that make a configuration differ from the fp32 trainer -> the change a knob's
    probe makes (``engine.kv_cache fp8->fp32``); none for a deterministic engine."""
    out = {} if numerics.deterministic else {
        f"engine.{k}": f"{getattr(numerics, k)}->{exact}" for k, exact in EXACT.items()
        if getattr(numerics, k) != exact and (k != "router" or moe)}
    if LAG_KNOB in out:  # measured where staleness exists (``sim/probe.py``)
        out[LAG_KNOB] += f" after {numerics.weight_lag} updates"
    if precision not in (None, "fp32"):
        out[PRECISION_KNOB] = f"{precision}->fp32"
    return out


class SimProbe(ProbeJob):
    """Probes of simulator configurations, in this process (``sim/probe.py``)."""

    version: ClassVar[str] = VERSION

    @classmethod
    def check(cls, config: Mapping[str, Any], pool: PoolSpec) -> str | None:
        """The trial's own validation (``SimTrainer.problems``' values): what trains, probes."""
        found = SimTrainer.problems(TrialConfig.of(config, pool), stages=frozenset({"values"}))
        return found[0].reason if found else None

    @classmethod
    def identity(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, Any]:
        setup = build_setup(config, pool)
        train = {k: setup.train[k] for k in ("prompts_per_step", "group_size") if k in setup.train}
        return {"trainer": SimTrainer.version, "pool": pool.name,
                "engine": setup.numerics.model_dump(mode="json"), "model": setup.model,
                "task": setup.task, "batch": train, "precision": setup.learner.precision,
                "routing_replay": setup.correction.routing_replay, "threads": setup.threads,
                "reproducible": setup.reproducible}

    @classmethod
    def knobs(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, str]:
        setup = build_setup(config, pool)
        return knobs(setup.numerics, setup.learner.precision,
                     setup.model.get("arch", "dense") == "moe")

    def run(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
            seeds: list[int], batches: int) -> tuple[list[dict[str, float]], dict[str, Any]]:
        setup = build_setup(config, pool)
        from orchestrator.sim import probe  # deferred: torch, only where a probe runs

        rows = probe.probe(setup, seeds, batches)
        return rows, _settings(setup)

    def run_knobs(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                  seeds: list[int], batches: int,
                  knobs: list[str]) -> dict[str, list[dict[str, float]]]:
        setup = build_setup(config, pool)
        from orchestrator.sim import probe  # deferred: torch, only where a probe runs

        turned = {k: None if k == PRECISION_KNOB else {k.removeprefix("engine."):
                                                        EXACT[k.removeprefix("engine.")]}
                  for k in knobs if k != LAG_KNOB}
        return probe.probe_knobs(setup, seeds, batches, turned,
                                 LAG_KNOB if LAG_KNOB in knobs else None)


def _settings(setup: SimSetup) -> dict[str, Any]:
    """The engine's resolved arithmetic, the trainer's precision and this process's numerics."""
    return {**{f"engine.{k}": v for k, v in setup.numerics.model_dump(mode="json").items()},
            "learner.precision": setup.learner.precision or "fp32",
            **numeric_environment(setup.reproducible)}
