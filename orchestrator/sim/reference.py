"""The simulator's reference evaluator (``eval: {reference: trainer}``, ``orchestrator/evaluation.py``).

The trainer-side model: the trainer's fp32 arithmetic (:class:`model.ExactOps`) on the trainer's
current weights (no weight lag, no engine rounding, no split-K, no quantisation), whatever the
trial's pool and engine flags. It samples the same held-out prompts as the trial's own eval,
decoding with an fp32 KV cache (the trainer's ops, one token at a time: what differs from a
full forward is only the order of fp32 sums), at the trial's temperature, which is part of the
policy the trainer optimises (its log-probs are divided by it too).

Its draws come from their own generator, seeded by (seed, step) on a stream nothing else uses,
so (a) two arms with one seed are scored on the same prompts with the same uniforms, and (b)
the evaluation touches no state of the trial: the trial's own numbers are the same bit for bit
with and without it (``tests/sim/test_reference_eval.py``), and a checkpoint scored after the
fact gives exactly the number the trial would have logged at that step.
"""
from __future__ import annotations

import torch

from orchestrator.sim.model import ExactOps, ModelConfig
from orchestrator.sim.profile import Numerics
from orchestrator.sim.rollout import RolloutEngine
from orchestrator.sim.task import Task

STREAM = 2  # the trainer's generator streams: 0 the step's rollouts, 1 its own eval
VERSION = "sim-ref-1"  # bump when the evaluator's numbers would change (recorded with them)


def numerics(temperature: float) -> Numerics:
    """The reference's arithmetic, in the engine's vocabulary: fp32 everywhere, current weights."""
    return Numerics(dtype="fp32", lm_head="fp32", kv_cache="fp32", router="fp32",
                    reduction_order="default", split_k=16, weight_quant="none", group_size=32,
                    weight_lag=0, chunked_prefill=0, deterministic=False, temperature=temperature)


class ReferenceEngine(RolloutEngine):
    """A rollout engine that computes like the trainer and serves the weights it is given."""

    def __init__(self, cfg: ModelConfig, task: Task, temperature: float) -> None:
        super().__init__(cfg, task, numerics(temperature))
        self.ops = ExactOps()  # type: ignore[assignment]

    def sync(self, trainer_params: dict[str, torch.Tensor]) -> None:
        """Serve ``trainer_params`` as they are now (read, never copied or changed)."""
        self.params = {k: v.detach() for k, v in trainer_params.items()}


@torch.no_grad()
def score(engine: ReferenceEngine, params: dict[str, torch.Tensor], prompts: torch.Tensor,
          gen: torch.Generator) -> float:
    """Mean reward of the reference's samples of ``prompts`` under ``params``."""
    engine.sync(params)
    ro = engine.generate(prompts, gen)
    return engine.task.reward(ro.prompts, ro.responses).mean().item()
