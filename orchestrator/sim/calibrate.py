"""Measure the mismatch a pool profile produces on a fixed reference policy (for calibration).

The reference policy is the recipe's model trained for ``steps`` GRPO steps with an fp32
rollout engine: a policy in its learning phase, where reward rises and entropy
is neither uniform nor collapsed. A profile is then measured by syncing a rollout engine with
the policy's last three snapshots (so ``weight_lag: k`` serves the one k updates old), sampling
batches and comparing mu with the fp32 trainer's log-probs of the same tokens.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any

import torch

from orchestrator import metrics as M
from orchestrator.corrections import CorrectionSpec, mismatch_metrics
from orchestrator.engine import RolloutSpec
from orchestrator.pools import PoolSpec
from orchestrator.sim.config import build_setup
from orchestrator.sim.model import ModelConfig, forward
from orchestrator.sim.profile import SimProfile, parse_profile, resolve_numerics
from orchestrator.sim.rollout import RolloutEngine
from orchestrator.sim.task import Task
from orchestrator.sim.trainer import GRPOTrainer, TrainConfig, token_logp


@dataclasses.dataclass
class Reference:
    model: ModelConfig
    task: Task
    history: list[dict[str, torch.Tensor]]  # weights 2 and 1 updates before ``params``
    params: dict[str, torch.Tensor]
    reward: float
    entropy: float


def reference_policy(config: Mapping[str, Any], pool: PoolSpec, steps: int,
                     seed: int = 0) -> Reference:
    """Train the recipe ``config`` for ``steps`` steps with the exact rollout engine."""
    setup = build_setup(config, pool)
    task = Task(**setup.task)
    model = ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model)
    # fp32 engine with a KV cache: mismatch ~1e-14, without the deterministic mode's cost.
    exact = resolve_numerics(SimProfile(dtype="fp32", lm_head="fp32", kv_cache="fp32"),
                             RolloutSpec())
    tr = GRPOTrainer(model, task, TrainConfig(**{**setup.train, "eval_every": 0}),
                     CorrectionSpec(), exact, seed)
    history: list[dict[str, torch.Tensor]] = []
    metrics: dict[str, float] = {}
    for step in range(1, steps + 1):
        history = [*history[-1:], {k: v.detach().clone() for k, v in tr.params.items()}]
        metrics = tr.step(step)
    return Reference(model, task, history, {k: v.detach().clone() for k, v in tr.params.items()},
                     metrics[M.TRAIN_REWARD], metrics[M.ENTROPY])


def measure_k3(ref: Reference, pool: PoolSpec, *, batches: int = 2, batch: int = 128,
               rollout: RolloutSpec | None = None) -> float:
    """Median over batches of the k3 KL between the pool's rollout engine and the trainer."""
    num = resolve_numerics(parse_profile(pool.sim_profile, pool.name), rollout or RolloutSpec())
    if num.weight_lag > len(ref.history):
        raise ValueError(f"the reference keeps {len(ref.history)} old snapshots; "
                         f"weight_lag {num.weight_lag} needs more")
    engine = RolloutEngine(ref.model, ref.task, num)
    for snapshot in (*ref.history, ref.params):  # the engine serves the one weight_lag back
        engine.sync(snapshot)
    values = []
    for b in range(batches):
        gen = torch.Generator().manual_seed(1000 + b)
        ro = engine.generate(ref.task.prompts(batch, gen), gen)
        with torch.no_grad():
            logits = forward(ref.params, ro.tokens, ref.model, temperature=num.temperature).logits
        old = token_logp(logits, ro.tokens, ref.task.prompt_len)
        values.append(mismatch_metrics(old, ro.logp_mu, ro.mask)[M.K3_KL])
    return statistics.median(values)
