"""The ``learner.loss`` policy losses on torch tensors, as the simulator's trainer runs them.

Each mode computes what verl 0.9.1's ``core_algos.compute_policy_loss_<mode>`` computes for one
mini-batch on one rank (``tests/backends/test_loss_parity.py`` runs them side by side on
generated batches): the per-token loss, the IS weights multiplied in, then verl's aggregation
(``agg_loss``): token mean over ``denom`` tokens for most modes, the mean over sequences of
per-sequence token means for ``sapo``, the plain mean over sequences for ``geo_mean``.
Shapes: [B, R]; ``mask`` is the loss mask (tokens kept after RS), ``weights`` the IS weights
or None. The settings a loss reads (clip range, ``clip_ratio_c``, aggregation: ``LossParams``)
are the trial's ``learner.*`` keys, whose defaults per loss are verl's examples
(``learner.LOSS_COMPANIONS``, one table for both trainers); the constants are verl's
``ActorConfig`` defaults.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from orchestrator.corrections import SAFETY_BOUND

CLIP_RATIO_C = 3.0  # ActorConfig.clip_ratio_c: dual-clip cap (vanilla), ratio truncation (DPPO)
TAU_POS, TAU_NEG = 1.0, 1.05  # ActorConfig.tau_pos / tau_neg (SAPO gates)
GSPO_LOG_CAP = 10.0  # verl clamps GSPO's log sequence ratio at 10


@dataclasses.dataclass(frozen=True)
class LossParams:
    """The settings of one policy loss (verl ``ActorConfig``: clip_ratio_low/high, clip_ratio_c,
    loss_agg_mode)."""

    low: float = 0.2
    high: float = 0.2
    clip_c: float = CLIP_RATIO_C
    agg: str = "token-mean"

    @classmethod
    def of(cls, learner: Any, clip_eps: float) -> LossParams:
        """A trial's: its ``learner.*`` settings (companions included, see ``learner``), else
        the simulator's symmetric ``train.clip_eps`` and verl's ActorConfig defaults."""
        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value
        return cls(pick(learner.clip_ratio_low, clip_eps), pick(learner.clip_ratio_high, clip_eps),
                   pick(learner.clip_ratio_c, CLIP_RATIO_C), pick(learner.loss_agg_mode, "token-mean"))


def _masked_sum(x: torch.Tensor, m: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    picked = torch.where(m != 0, x, 0.0) * m
    return picked.sum() if dim is None else picked.sum(dim)


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _masked_sum(x, m) / m.sum().clamp_min(1e-8)


def _token_mean(per_tok: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | float) -> torch.Tensor:
    return _masked_sum(per_tok, mask) / denom


def _agg(per_tok: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | float,
         mode: str) -> torch.Tensor:
    """verl's ``agg_loss`` (core_algos.py:1169-1203) on one rank: token-mean over ``denom``
    tokens, or seq-mean-token-mean (the mean over non-empty sequences of their token means)."""
    if mode == "token-mean":
        return _token_mean(per_tok, mask, denom)
    if mode != "seq-mean-token-mean":
        raise ValueError(f"loss_agg_mode {mode!r} is not simulated")
    count = mask.sum(-1)
    seq_loss = _masked_sum(per_tok, mask, -1) / (count + 1e-8)
    seq_valid = (count > 0).to(seq_loss.dtype)
    return _masked_sum(seq_loss, seq_valid) / seq_valid.sum()


def _weighted(per_tok: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_tok if weights is None else per_tok * weights


def _ratio(logp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old).clamp(-SAFETY_BOUND, SAFETY_BOUND))


LossOut = tuple[torch.Tensor, float]  # (loss, clip fraction)


def vanilla(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    """PPO clip with verl's dual clip: for A < 0 the loss is capped at -A * clip_ratio_c."""
    ratio = _ratio(logp, old)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - p.low, 1 + p.high)
    clipped = torch.maximum(l1, l2)
    dual = torch.minimum(-adv * p.clip_c, clipped)
    per_tok = _weighted(torch.where(adv < 0, dual, clipped), weights)
    return _agg(per_tok, mask, denom, p.agg), _masked_mean((l2 > l1).float(), mask).item()


def gspo(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    """Sequence ratio s = exp(mean_t log r), carried per token as sg[s] * pi / sg[pi]."""
    seq = _masked_sum(logp - old, mask, -1) / mask.sum(-1).clamp(min=1)
    log_s = (logp - logp.detach() + seq.detach().unsqueeze(-1)).clamp(max=GSPO_LOG_CAP)
    s = torch.exp(log_s)
    l1, l2 = -adv * s, -adv * s.clamp(1 - p.low, 1 + p.high)
    per_tok = _weighted(torch.maximum(l1, l2), weights)
    return _agg(per_tok, mask, denom, p.agg), _masked_mean((l2 > l1).float(), mask).item()


def cispo(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    ratio = _ratio(logp, old)
    clipped = ratio.clamp(1 - p.low, 1 + p.high)
    per_tok = _weighted(-clipped.detach() * adv * logp, weights)
    return _agg(per_tok, mask, denom, p.agg), _masked_mean((ratio != clipped).float(), mask).item()


def sapo(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    """Gate f(r) = sigmoid(tau (r - 1)) * 4 / tau; always the sequence mean of token means."""
    ratio = _ratio(logp, old)
    tau = torch.where(adv > 0, torch.tensor(TAU_POS, dtype=adv.dtype),
                      torch.tensor(TAU_NEG, dtype=adv.dtype))
    per_tok = _weighted(-(torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)) * adv, weights)
    count = mask.sum(-1)
    seq_loss = (per_tok * mask).sum(-1) / (count + 1e-8)
    seq_valid = (count > 0).float()
    return _masked_sum(seq_loss, seq_valid) / seq_valid.sum(), 0.0


def geo_mean(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    """GMPO: exp(mean_t of the sign-aware token-clipped log ratio) x the sequence advantage."""
    log_r = logp - old
    sgn = torch.sign(adv)
    clamped = log_r.clamp(-p.low, p.high)
    log_min = sgn * torch.minimum(sgn * log_r, sgn * clamped)
    count = mask.sum(-1)
    ratio = torch.exp((log_min * mask).sum(-1) / (count + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (count + 1e-8)
    per_seq = -seq_adv * ratio
    if weights is not None:  # the geometric mean of the token weights
        per_seq = per_seq * torch.exp((torch.log(weights + 1e-10) * mask).sum(-1) / (count + 1e-8))
    clipfrac = _masked_mean((torch.ne(log_r, clamped) & (adv > 0)).float(), mask).item()
    return per_seq.mean(), clipfrac


def _dppo(valid: torch.Tensor, logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    truncated = _ratio(logp, old).clamp(max=p.clip_c).detach()
    per_tok = _weighted(-adv * truncated * logp * valid, weights)
    return _agg(per_tok, mask, denom, p.agg), _masked_mean(1.0 - valid, mask).item()


def dppo_tv(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    diff = torch.exp(logp) - torch.exp(old)
    valid = torch.where(adv > 0, diff <= p.high, diff >= -p.low).detach().float()
    return _dppo(valid, logp, old, adv, mask, weights, denom, p)


def dppo_kl(logp, old, adv, mask, weights, denom, p: LossParams) -> LossOut:
    pi, pi_old = torch.exp(logp), torch.exp(old)
    kl = pi_old * (old - logp) + (1 - pi_old) * torch.log((1.0 - pi_old + 1e-8) / (1.0 - pi + 1e-8))
    pos, neg = (kl <= p.high) | (pi <= pi_old), (kl <= p.low) | (pi >= pi_old)
    valid = torch.where(adv > 0, pos, neg).detach().float()
    return _dppo(valid, logp, old, adv, mask, weights, denom, p)


LOSS_FNS: dict[str, Callable[..., LossOut]] = {
    "vanilla": vanilla, "gspo": gspo, "cispo": cispo, "sapo": sapo, "geo_mean": geo_mean,
    "dppo_tv": dppo_tv, "dppo_kl": dppo_kl,
}


def policy_loss(mode: str, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, weights: torch.Tensor | None, denom: torch.Tensor | float,
                params: LossParams | float) -> LossOut:
    """Loss ``mode`` of ``learner.loss``; ``adv`` [B] or [B, R] (broadcast over the tokens);
    ``params`` the loss's settings (a float: a symmetric clip range, the rest verl's defaults)."""
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv
    if not isinstance(params, LossParams):
        params = LossParams(params, params)
    return LOSS_FNS[mode](logp, old, adv, mask, weights, denom, params)
