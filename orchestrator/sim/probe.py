"""The simulator's probe job (``ablate probe``, ``orchestrator/probe``): the mismatch of one
configuration before it trains.

A probe batch is the first half of a trial's step, no update: prompts drawn with the step's own
generator, sampled by the rollout engine, their log-probs recomputed by the trainer (its
precision, its routing replay). Batch ``b`` of seed ``s`` is step ``b`` of seed ``s``'s trial
with the initial weights, so batch 1 is that trial's step 1 exactly (``tests/probe``).

Knobs (``--attribute``): one rollout-engine setting (``Numerics``) or the trainer's precision
set to what the fp32 trainer computes, the rest left as they are; the paired change in k3 over
the same batches is that knob's share. The engine's weight lag is the exception: at step 1 the
engine and the trainer hold the same initial weights, so staleness is invisible to a step-1
probe. Its knob is measured where it first exists, at step ``lag + 1`` after ``lag`` real
updates of the configuration (its optimizer and correction), the engine serving the weights
``lag`` syncs old vs the trainer's current ones.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from orchestrator import metrics as M
from orchestrator.sim.config import SimSetup
from orchestrator.sim.correction_math import mismatch_metrics
from orchestrator.sim.model import ModelConfig, forward
from orchestrator.sim.precision import trainer_ops
from orchestrator.sim.profile import Numerics
from orchestrator.sim.rollout import RolloutEngine
from orchestrator.sim.task import Task
from orchestrator.sim.trainer import GRPOTrainer, TrainConfig, _gen, token_logp

QUANTILES = (0.5, 0.9, 0.99)


def batch_stats(logp_old: torch.Tensor, logp_mu: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float]:
    """The trials' mismatch metrics of one batch (``correction_math.mismatch_metrics``) and the
    token-level ones only a probe reports: |log mu - log pi| max and quantiles, the share of
    tokens whose two log-probs are bitwise equal, and the token count."""
    out = mismatch_metrics(logp_old, logp_mu, mask)
    valid = mask.bool()
    diff = (logp_mu.double() - logp_old.double()).abs()[valid]
    out["tokens"] = float(valid.sum().item())
    if diff.numel():
        out["abs_diff_max"] = diff.max().item()
        for q, v in zip(QUANTILES, torch.quantile(diff, torch.tensor(QUANTILES, dtype=diff.dtype))):
            out[f"abs_diff_p{q * 100:g}"] = v.item()
        out["bitwise_share"] = (logp_mu[valid] == logp_old[valid]).double().mean().item()
    return out


def _engine(trainer: GRPOTrainer, numerics: Numerics) -> RolloutEngine:
    engine = RolloutEngine(trainer.model, trainer.task, numerics)
    engine.sync(trainer.params)
    return engine


@torch.no_grad()
def measure(trainer: GRPOTrainer, step: int, engine: RolloutEngine | None = None,
            ops: Any = "trainer") -> dict[str, float]:
    """Sample step ``step``'s batch with ``engine`` (the trainer's own by default) and
    recompute it with the trainer (``ops``: its arithmetic by default), as ``GRPOTrainer.step``
    does before its update; the batch's stats with its wall time."""
    cfg, plen = trainer.cfg, trainer.task.prompt_len
    engine = engine or trainer.engine
    gen = _gen(trainer.seed, step, 0)
    t0 = time.perf_counter()
    prompts = trainer.task.prompts(cfg.prompts_per_step, gen).repeat_interleave(cfg.group_size, 0)
    ro = engine.generate(prompts, gen)
    replay = ro.routing if trainer.corr.routing_replay == "R3" and ro.routing else None
    out = forward(trainer.params, ro.tokens, trainer.model,
                  trainer.ops if ops == "trainer" else ops,
                  temperature=trainer.num.temperature, replay=replay)
    logp_old = token_logp(out.logits, ro.tokens, plen)
    seconds = time.perf_counter() - t0
    return {**batch_stats(logp_old, ro.logp_mu, ro.mask), "wall_s": seconds}


def build(setup: SimSetup, seed: int) -> GRPOTrainer:
    """A fresh trainer of ``setup`` with seed ``seed``'s initial weights (and engine)."""
    torch.set_num_threads(setup.threads)
    task = Task(**setup.task)
    model = ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model)
    return GRPOTrainer(model, task, TrainConfig(**setup.train), setup.correction, setup.numerics,
                       seed, setup.learner)


def probe(setup: SimSetup, seeds: Sequence[int], batches: int) -> list[dict[str, float]]:
    """One row per (seed, batch): the batch's stats, batches 1..``batches`` of each seed."""
    rows = []
    for seed in seeds:
        trainer = build(setup, seed)
        rows += [{"seed": seed, "batch": b, **measure(trainer, b)} for b in range(1, batches + 1)]
    return rows


def probe_knobs(setup: SimSetup, seeds: Sequence[int], batches: int,
                turned: Mapping[str, Mapping[str, Any] | None],
                stale: str | None = None) -> dict[str, list[dict[str, float]]]:
    """Per knob, one row per (seed, batch): k3 of the configuration and k3 with the knob turned
    on the same batch (paired). ``turned``: knob -> the engine fields it sets, or None for the
    trainer's precision set to fp32; the configuration's own k3 of a batch is computed once for
    all of them. ``stale``: the weight lag's knob name (measured by :func:`_stale_rows`)."""
    out: dict[str, list[dict[str, float]]] = {k: [] for k in turned}
    for seed in seeds:
        trainer = build(setup, seed)
        variants = {k: (None, trainer_ops(None)) if update is None else
                    (_engine(trainer, setup.numerics.model_copy(update=dict(update))), "trainer")
                    for k, update in turned.items()}
        for b in range(1, batches + 1) if variants else ():
            base = measure(trainer, b)[M.K3_KL]
            for k, (engine, ops) in variants.items():
                out[k].append({"seed": seed, "batch": b, "k3": base,
                               "k3_without": measure(trainer, b, engine, ops)[M.K3_KL]})
        if stale is not None:
            out.setdefault(stale, []).extend(_stale_rows(setup, seed, batches))
    return out


def _stale_rows(setup: SimSetup, seed: int, batches: int) -> list[dict[str, float]]:
    """The weight lag where it exists: after ``lag`` real steps of the configuration, batches
    ``lag + 1``.. sampled by the engine serving the weights ``lag`` syncs old vs by one serving
    the trainer's current weights."""
    trainer = build(setup, seed)
    lag = setup.numerics.weight_lag
    for step in range(1, lag + 1):
        trainer.step(step)
    current = _engine(trainer, setup.numerics.model_copy(update={"weight_lag": 0}))
    return [{"seed": seed, "batch": b, "k3": measure(trainer, b)[M.K3_KL],
             "k3_without": measure(trainer, b, current)[M.K3_KL]}
            for b in range(lag + 1, lag + batches + 1)]


def engine_settings(numerics: Numerics) -> dict[str, Any]:
    """What the simulator's engine computed with: its resolved arithmetic."""
    return numerics.model_dump(mode="json")
