"""GRPO trainer of the simulator: fp32 policy, pi_old recompute, corrections, AdamW.

Every random draw of step ``s`` comes from a generator seeded by (seed, s), so a run resumed
from a checkpoint draws exactly what the uninterrupted run drew.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from orchestrator import metrics as M
from orchestrator.corrections import CorrectionSpec
from orchestrator.exceptions import NumericFailure
from orchestrator.learner import LearnerSpec
from orchestrator.sim import loss_math, reference
from orchestrator.sim.correction_math import (
    Correction,
    apply_correction,
    correction_metrics,
    empty_update,
    mismatch_metrics,
    opsm_mask,
    policy_loss,
)
from orchestrator.sim.model import ModelConfig, forward, init_params
from orchestrator.sim.precision import LossScaler, trainer_ops
from orchestrator.sim.profile import Numerics
from orchestrator.sim.rollout import RolloutEngine, Rollouts
from orchestrator.sim.task import Task

EVAL_PROMPT_SEED = 20_251_017  # the same held-out prompts for every trial
CKPT_FILE = "state.pt"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    lr: float = 5e-4
    prompts_per_step: int = 16
    group_size: int = 8
    ppo_epochs: int = 1
    minibatches: int = 4
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    aux_loss_coef: float = 0.01
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    eval_every: int = 10
    eval_prompts: int = 128
    eval_reference: str | None = None  # "trainer": also score evals with sim/reference.py


def _gen(seed: int, step: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + stream)


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, plen: int) -> torch.Tensor:
    """Log-prob [B, R] of each response token under ``logits`` [B, T, V] of the whole sequence."""
    lp = F.log_softmax(logits, dim=-1)[:, plen - 1:-1]
    return lp.gather(-1, tokens[:, plen:, None]).squeeze(-1)


def _finite(name: str, x: torch.Tensor, step: int) -> None:
    if not torch.isfinite(x).all():
        raise NumericFailure(f"non-finite {name} at step {step}")


class AdamW:
    """AdamW (decoupled weight decay, bias-corrected moments, eps outside the square root), as
    ``torch.optim.AdamW`` defines it. Written out because constructing any ``torch.optim``
    optimizer imports ``torch._dynamo``: seconds of fixed cost per trial process.

    One deliberate difference: the square root of the second moment is taken in float64 and
    rounded to float32, i.e. correctly rounded. torch's float32 sqrt kernel is an approximation
    (about 16% of results one ulp off) whose last bit depends on the processor, which would make
    every trial's weights a property of the CPU (measured: identical everywhere else in a step,
    different after the first optimizer update on an emulated Zen 2)."""

    def __init__(self, params: dict[str, torch.Tensor], lr: float, betas: tuple[float, float],
                 weight_decay: float, eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.wd, self.eps = params, lr, betas, weight_decay, eps
        self.t = 0
        self.m = {k: torch.zeros_like(v) for k, v in params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in params.items()}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        keys = [k for k, p in self.params.items() if p.grad is not None]
        ps, gs = [self.params[k] for k in keys], [self.params[k].grad for k in keys]
        ms, vs = [self.m[k] for k in keys], [self.v[k] for k in keys]
        if self.wd:
            torch._foreach_mul_(ps, 1.0 - self.lr * self.wd)
        torch._foreach_lerp_(ms, gs, 1.0 - b1)  # m <- b1 m + (1 - b1) g
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1.0 - b2)  # v <- b2 v + (1 - b2) g^2
        denom = [v.double().sqrt_().float() for v in vs]  # correctly rounded (see above)
        torch._foreach_div_(denom, math.sqrt(1.0 - b2 ** self.t))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(ps, ms, denom, -self.lr / (1.0 - b1 ** self.t))

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": dict(self.m), "v": dict(self.v)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.t = int(state["t"])
        for k in self.params:
            self.m[k].copy_(state["m"][k])
            self.v[k].copy_(state["v"][k])


class GRPOTrainer:
    """One trial's policy, optimizer and rollout engine."""

    def __init__(self, model: ModelConfig, task: Task, train: TrainConfig,
                 correction: CorrectionSpec, numerics: Numerics, seed: int,
                 learner: LearnerSpec | None = None) -> None:
        self.model, self.task, self.cfg = model, task, train
        self.corr, self.num, self.seed = correction, numerics, seed
        self.learner = learner or LearnerSpec()
        # learner.precision: the trainer's own arithmetic (None: plain fp32, sim/precision.py)
        self.ops = trainer_ops(self.learner.precision)
        self.scaler = LossScaler() if self.learner.precision == "fp16" else None
        # learner.loss's settings: the trial's learner.* keys (its loss's companions, added at
        # plan by grid._expansion), else train.clip_eps and verl's ActorConfig defaults
        self.loss_params = loss_math.LossParams.of(self.learner, train.clip_eps)
        self.params = {k: v.requires_grad_() for k, v in init_params(model, seed).items()}
        self.ref = init_params(model, seed) if train.kl_coef > 0 else None
        self.opt = AdamW(self.params, train.lr, (train.adam_beta1, train.adam_beta2),
                         train.weight_decay)
        self.engine = RolloutEngine(model, task, numerics)
        self.engine.sync(self.params)
        self.eval_prompts = task.prompts(train.eval_prompts,
                                         torch.Generator().manual_seed(EVAL_PROMPT_SEED))
        self.reference = (reference.ReferenceEngine(model, task, numerics.temperature)
                          if train.eval_reference else None)

    # ------------------------------------------------------------------ one step
    def step(self, step: int) -> dict[str, float]:
        """Run step ``step`` (1-based); raises NumericFailure on NaN/inf."""
        cfg, plen = self.cfg, self.task.prompt_len
        gen = _gen(self.seed, step, 0)
        t0 = time.perf_counter()
        prompts = self.task.prompts(cfg.prompts_per_step, gen).repeat_interleave(cfg.group_size, 0)
        ro = self.engine.generate(prompts, gen)
        t_gen = time.perf_counter() - t0
        rewards = self.task.reward(ro.prompts, ro.responses)
        grouped = rewards.view(-1, cfg.group_size)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6))
        adv = adv.view(-1).float()
        _finite("rollout log-probs", ro.logp_mu, step)

        replay = ro.routing if self.corr.routing_replay == "R3" and ro.routing else None
        with torch.no_grad():
            out = forward(self.params, ro.tokens, self.model, self.ops,
                          temperature=self.num.temperature, replay=replay)
            logp_old = token_logp(out.logits, ro.tokens, plen)
            lp = F.log_softmax(out.logits[:, plen - 1:-1], dim=-1)
            entropy = -(lp.exp() * lp).sum(-1)
        _finite("pi_old log-probs", logp_old, step)
        if self.corr.routing_replay == "R2":
            replay = out.routing
        metrics = mismatch_metrics(logp_old, ro.logp_mu, ro.mask)
        corr = None
        if self.corr.policy == "decoupled":
            corr = apply_correction(logp_old, ro.logp_mu, ro.mask, self.corr)
            metrics.update(correction_metrics(corr))
        t1 = time.perf_counter()
        metrics.update(self._update(step, ro, logp_old, adv, corr, replay, gen))
        self.engine.sync(self.params)
        t_upd = time.perf_counter() - t1
        metrics.update({
            M.TRAIN_REWARD: rewards.mean().item(),
            M.RESPONSE_LENGTH: ro.mask.sum(1).mean().item(),
            M.ENTROPY: (entropy * ro.mask).sum().item() / ro.mask.sum().item(),
            M.LR: cfg.lr,
            M.TIME_GEN: t_gen, M.TIME_UPDATE: t_upd,
        })
        if cfg.eval_every and step % cfg.eval_every == 0:
            metrics[M.EVAL_REWARD] = self.evaluate(step)
            if self.reference is not None:
                t2 = time.perf_counter()
                metrics[M.EVAL_REWARD_REF] = self.evaluate_reference(step)
                metrics[M.TIME_EVAL_REF] = time.perf_counter() - t2
        metrics[M.TIME_PER_STEP] = time.perf_counter() - t0
        return metrics

    def _update(self, step: int, ro: Rollouts, logp_old: torch.Tensor, adv: torch.Tensor,
                corr: Correction | None, replay: list[torch.Tensor] | None,
                gen: torch.Generator) -> dict[str, float]:
        cfg, plen = self.cfg, self.task.prompt_len
        n = ro.tokens.shape[0]
        acc: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(n, generator=gen)
            for idx in perm.chunk(cfg.minibatches):
                rep = [r[idx] for r in replay] if replay else None
                out = forward(self.params, ro.tokens[idx], self.model, self.ops,
                              temperature=self.num.temperature, replay=rep)
                logp = token_logp(out.logits, ro.tokens[idx], plen)
                mu, mask = ro.logp_mu[idx], ro.mask[idx]
                if corr is None:  # bypass: pi_old := mu, corrections from the live policy
                    c, anchor = apply_correction(logp.detach(), mu, mask, self.corr), mu
                    for k, v in correction_metrics(c).items():
                        acc.setdefault(k, []).append(v)
                else:
                    c = Correction(None if corr.weights is None else corr.weights[idx],
                                   corr.loss_mask[idx], corr.denom_mask[idx], {})
                    anchor = logp_old[idx]
                empty = empty_update(mask, c.loss_mask)
                if empty:  # no optimizer step on nothing: the attempt ends as a numeric failure
                    raise NumericFailure(f"step {step}, mini-batch of {len(idx)} responses: {empty}")
                extra = None
                if self.corr.opsm is not None:
                    extra = opsm_mask(logp, mu, mask, adv[idx], self.corr.opsm)
                    acc.setdefault(M.OPSM_FRACTION, []).append(1.0 - extra.mean().item())
                if self.learner.loss is None:
                    loss, m = policy_loss(logp, anchor, adv[idx], c, self.corr, cfg.clip_eps, extra)
                else:  # learner.loss: verl's policy-loss modes (sim/loss_math.py)
                    keep = c.loss_mask if extra is None else c.loss_mask * extra
                    loss, frac = loss_math.policy_loss(
                        self.learner.loss, logp, anchor, adv[idx], keep, c.weights,
                        c.denom_mask.sum().clamp_min(1.0), self.loss_params)
                    m = {"pg_clipfrac": frac}
                parts = {M.PG_LOSS: loss.item(), M.PG_CLIPFRAC: m["pg_clipfrac"],
                         M.PPO_KL: ((anchor - logp.detach()) * mask).sum().item()
                         / mask.sum().clamp_min(1).item()}
                if self.ref is not None:
                    with torch.no_grad():
                        ref = token_logp(forward(self.ref, ro.tokens[idx], self.model,
                                                 temperature=self.num.temperature).logits,
                                         ro.tokens[idx], plen)
                    d = (ref - logp).clamp(-20, 20)
                    kl = ((torch.exp(d) - d - 1).clamp(-10, 10) * mask).sum() / mask.sum().clamp_min(1)
                    loss = loss + cfg.kl_coef * kl
                    parts[M.KL_LOSS] = kl.item()
                if self.model.moe:
                    loss = loss + cfg.aux_loss_coef * out.aux_loss
                _finite("loss", loss, step)
                self.opt.zero_grad()
                if self.scaler is not None:
                    gn, finite = self._scaled_backward(loss)
                    parts[M.LOSS_SCALE] = self.scaler.scale
                    parts[M.SKIPPED_SHARE] = float(not finite)
                    if not finite:  # overflow: the update is skipped, as GradScaler does, and
                        # the non-finite grad norm is logged, as verl logs it
                        parts[M.GRAD_NORM] = gn.item()
                        for k, v in parts.items():
                            acc.setdefault(k, []).append(v)
                        continue
                else:
                    loss.backward()
                    gn = torch.nn.utils.clip_grad_norm_(list(self.params.values()), cfg.grad_clip)
                _finite("grad norm", gn, step)
                self.opt.step()
                parts[M.GRAD_NORM] = gn.item()
                for k, v in parts.items():
                    acc.setdefault(k, []).append(v)
        return {k: sum(v) / len(v) for k, v in acc.items()}

    def _scaled_backward(self, loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """fp16, in verl's order (transformer_impl.py:798-834): backward of the scaled loss,
        gradients unscaled, then clipped; (grad norm, whether it is finite). On overflow the
        grad norm is non-finite, the gradients are dropped (the update is skipped) and the scale
        halves; otherwise the scale may grow."""
        assert self.scaler is not None
        (loss * self.scaler.scale).backward()
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        torch._foreach_div_(grads, self.scaler.scale)
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        self.scaler.update(finite)
        if not finite:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
            self.opt.zero_grad()
            return norm, False
        return torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.cfg.grad_clip), True

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Mean reward on the fixed held-out prompts, sampled by the rollout engine."""
        ro = self.engine.generate(self.eval_prompts, _gen(self.seed, step, 1))
        return self.task.reward(ro.prompts, ro.responses).mean().item()

    def evaluate_reference(self, step: int) -> float:
        """Mean reward on the same prompts, sampled by the reference evaluator
        (``sim/reference.py``) from the current weights; touches no state of the trial."""
        engine = self.reference or reference.ReferenceEngine(self.model, self.task,
                                                             self.num.temperature)
        return reference.score(engine, self.params, self.eval_prompts,
                               _gen(self.seed, step, reference.STREAM))

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path, step: int) -> None:
        """Model, optimizer, RNG, step and the engine's stale-weight queue (torch.save, no pickle
        of arbitrary objects: tensors, dicts, lists and numbers only)."""
        state: dict[str, Any] = {
            "step": step,
            "params": {k: v.detach() for k, v in self.params.items()},
            "optimizer": self.opt.state_dict(),
            "engine_queue": self.engine.state(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.scaler is not None:
            state["loss_scale"] = self.scaler.state_dict()
        torch.save(state, Path(directory) / CKPT_FILE)

    def load(self, directory: Path) -> int:
        """Restore a checkpoint written by :meth:`save`; returns its step."""
        state: Mapping[str, Any] = torch.load(Path(directory) / CKPT_FILE, weights_only=True)
        with torch.no_grad():
            for k, v in state["params"].items():
                self.params[k].copy_(v)
        self.opt.load_state_dict(state["optimizer"])
        self.engine.load_state(state["engine_queue"])
        torch.set_rng_state(state["torch_rng"])
        if self.scaler is not None and "loss_scale" in state:
            self.scaler.load_state_dict(state["loss_scale"])
        return int(state["step"])
