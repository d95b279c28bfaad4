"""The ``learner.loss`` policy losses on torch tensors, as the simulator's trainer runs them.

Each mode computes what verl 0.9.1's ``core_algos.compute_policy_loss_<mode>`` computes for one
mini-batch on one rank (``tests/backends/test_loss_parity.py`` runs them side by side on
generated batches): the per-token loss, the IS weights multiplied in, then verl's aggregation
(``agg_loss``): token mean over ``denom`` tokens for most modes, the mean over sequences of
per-sequence token means for ``sapo``, the plain mean over sequences for ``geo_mean``.
Shapes: [B, R]; ``mask`` is the loss mask (tokens kept after RS), ``weights`` the IS weights
or None. The constants are verl's ``ActorConfig`` defaults, which the verl recipes keep.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from orchestrator.corrections import SAFETY_BOUND

CLIP_RATIO_C = 3.0  # ActorConfig.clip_ratio_c: dual-clip cap (vanilla), ratio truncation (DPPO)
TAU_POS, TAU_NEG = 1.0, 1.05  # ActorConfig.tau_pos / tau_neg (SAPO gates)
GSPO_LOG_CAP = 10.0  # verl clamps GSPO's log sequence ratio at 10


def _masked_sum(x: torch.Tensor, m: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    picked = torch.where(m != 0, x, 0.0) * m
    return picked.sum() if dim is None else picked.sum(dim)


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return _masked_sum(x, m) / m.sum().clamp_min(1e-8)


def _token_mean(per_tok: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | float) -> torch.Tensor:
    return _masked_sum(per_tok, mask) / denom


def _weighted(per_tok: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return per_tok if weights is None else per_tok * weights


def _ratio(logp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old).clamp(-SAFETY_BOUND, SAFETY_BOUND))


LossOut = tuple[torch.Tensor, float]  # (loss, clip fraction)


def vanilla(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    """PPO clip with verl's dual clip: for A < 0 the loss is capped at -A * 3."""
    ratio = _ratio(logp, old)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - eps, 1 + eps)
    clipped = torch.maximum(l1, l2)
    dual = torch.minimum(-adv * CLIP_RATIO_C, clipped)
    per_tok = _weighted(torch.where(adv < 0, dual, clipped), weights)
    return _token_mean(per_tok, mask, denom), _masked_mean((l2 > l1).float(), mask).item()


def gspo(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    """Sequence ratio s = exp(mean_t log r), carried per token as sg[s] * pi / sg[pi]."""
    seq = _masked_sum(logp - old, mask, -1) / mask.sum(-1).clamp(min=1)
    log_s = (logp - logp.detach() + seq.detach().unsqueeze(-1)).clamp(max=GSPO_LOG_CAP)
    s = torch.exp(log_s)
    l1, l2 = -adv * s, -adv * s.clamp(1 - eps, 1 + eps)
    per_tok = _weighted(torch.maximum(l1, l2), weights)
    return _token_mean(per_tok, mask, denom), _masked_mean((l2 > l1).float(), mask).item()


def cispo(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    ratio = _ratio(logp, old)
    clipped = ratio.clamp(1 - eps, 1 + eps)
    per_tok = _weighted(-clipped.detach() * adv * logp, weights)
    return _token_mean(per_tok, mask, denom), _masked_mean((ratio != clipped).float(), mask).item()


def sapo(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    """Gate f(r) = sigmoid(tau (r - 1)) * 4 / tau; always the sequence mean of token means."""
    ratio = _ratio(logp, old)
    tau = torch.where(adv > 0, torch.tensor(TAU_POS, dtype=adv.dtype),
                      torch.tensor(TAU_NEG, dtype=adv.dtype))
    per_tok = _weighted(-(torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)) * adv, weights)
    count = mask.sum(-1)
    seq_loss = (per_tok * mask).sum(-1) / (count + 1e-8)
    seq_valid = (count > 0).float()
    return _masked_sum(seq_loss, seq_valid) / seq_valid.sum(), 0.0


def geo_mean(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    """GMPO: exp(mean_t of the sign-aware token-clipped log ratio) x the sequence advantage."""
    log_r = logp - old
    sgn = torch.sign(adv)
    clamped = log_r.clamp(-eps, eps)
    log_min = sgn * torch.minimum(sgn * log_r, sgn * clamped)
    count = mask.sum(-1)
    ratio = torch.exp((log_min * mask).sum(-1) / (count + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (count + 1e-8)
    per_seq = -seq_adv * ratio
    if weights is not None:  # the geometric mean of the token weights
        per_seq = per_seq * torch.exp((torch.log(weights + 1e-10) * mask).sum(-1) / (count + 1e-8))
    clipfrac = _masked_mean((torch.ne(log_r, clamped) & (adv > 0)).float(), mask).item()
    return per_seq.mean(), clipfrac


def _dppo(valid: torch.Tensor, logp, old, adv, mask, weights, denom) -> LossOut:
    truncated = _ratio(logp, old).clamp(max=CLIP_RATIO_C).detach()
    per_tok = _weighted(-adv * truncated * logp * valid, weights)
    return _token_mean(per_tok, mask, denom), _masked_mean(1.0 - valid, mask).item()


def dppo_tv(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    diff = torch.exp(logp) - torch.exp(old)
    valid = torch.where(adv > 0, diff <= eps, diff >= -eps).detach().float()
    return _dppo(valid, logp, old, adv, mask, weights, denom)


def dppo_kl(logp, old, adv, mask, weights, denom, eps) -> LossOut:
    p, p_old = torch.exp(logp), torch.exp(old)
    kl = p_old * (old - logp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    pos, neg = (kl <= eps) | (p <= p_old), (kl <= eps) | (p >= p_old)
    valid = torch.where(adv > 0, pos, neg).detach().float()
    return _dppo(valid, logp, old, adv, mask, weights, denom)


LOSS_FNS: dict[str, Callable[..., LossOut]] = {
    "vanilla": vanilla, "gspo": gspo, "cispo": cispo, "sapo": sapo, "geo_mean": geo_mean,
    "dppo_tv": dppo_tv, "dppo_kl": dppo_kl,
}


def policy_loss(mode: str, logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, weights: torch.Tensor | None, denom: torch.Tensor | float,
                clip_eps: float) -> LossOut:
    """Loss ``mode`` of ``learner.loss``; ``adv`` [B] or [B, R] (broadcast over the tokens)."""
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv
    return LOSS_FNS[mode](logp, old, adv, mask, weights, denom, clip_eps)
