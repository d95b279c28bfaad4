"""The correction vocabulary's math on torch tensors, as the simulator's trainer runs it.

What each ``correction.*`` key means, and how this math decides where Miles and verl disagree or
are silent, is documented with the vocabulary in ``orchestrator/corrections.py``; for every
specification the verl backend accepts, the weights, loss mask and denominator mask computed here
equal verl 0.9.1's (``tests/backends/test_correction_parity.py`` runs the whole matrix through
verl's own helper). Shapes: [B, R] per response token; ``mask`` is the response mask (1 =
generated token).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from orchestrator import metrics as M
from orchestrator.corrections import (
    SAFETY_BOUND,
    CorrectionSpec,
    parse_lo_hi,
    rejection_rules,
)


@dataclasses.dataclass
class Correction:
    """What a correction does to one batch (all tensors detached)."""

    weights: torch.Tensor | None  # [B, R] IS weights on the per-token loss; None = not applied
    loss_mask: torch.Tensor  # [B, R] tokens kept after RS, filters and veto
    denom_mask: torch.Tensor  # [B, R] tokens counted in the loss denominator
    metrics: dict[str, float]


def _masked_sum(x: torch.Tensor, m: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x * m`` over the positions where ``m != 0``; what ``x`` holds elsewhere (NaN,
    -inf in padding) never reaches the sum, as in verl's ``masked_sum``."""
    picked = torch.where(m != 0, x, 0.0) * m
    return picked.sum() if dim is None else picked.sum(dim)


def _masked_mean(x: torch.Tensor, m: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return _masked_sum(x, m, dim) / (m.sum() if dim is None else m.sum(dim)).clamp_min(1e-8)


def level_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The IS log-ratio at ``level`` (token | sequence | geometric), broadcast to [B, R].

    Aggregated from the raw per-token log-ratios; the caller clamps the result to +-20 (Miles'
    and verl's IS weights). RS clamps per token first (:func:`_filter_keep`)."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        agg = _masked_sum(log_ratio, mask, -1)
    elif level == "geometric":
        agg = _masked_sum(log_ratio, mask, -1) / mask.sum(-1).clamp_min(1.0)
    else:
        raise ValueError(f"unknown level {level!r}")
    return agg.unsqueeze(-1).expand_as(log_ratio)


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor,
               spec: CorrectionSpec) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """IS weights for ``spec``: (weights, raw weights, metrics). Level none -> all ones."""
    if spec.is_level == "none":
        return mask.clone(), mask.clone(), {}
    lr = level_log_ratio(log_ratio, mask, spec.is_level)
    raw = torch.where(mask != 0, torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask, 0.0)
    lo, hi = spec.is_lo, spec.is_hi
    metrics: dict[str, float] = {}
    if spec.is_mode == "truncate":  # TIS: clamp above only
        w = raw.clamp(max=hi)
    elif spec.is_mode == "clip":  # CIS: clamp both sides
        w = raw.clamp(lo, hi) * mask
    else:  # mask (IcePop band): the weight is kept inside [lo, hi] and zeroed outside
        keep = (raw >= lo) & (raw <= hi)
        w = torch.where(keep, raw, torch.zeros_like(raw))
        metrics["is_masked"] = _masked_mean((~keep).to(raw.dtype), mask).item()
    w = w.detach()
    if spec.batch_norm:
        if spec.is_level == "token":
            mean = _masked_mean(w, mask)
        else:  # one weight per sequence: mean over sequences of the per-sequence weight
            seq_valid = (mask.sum(-1) > 0).to(w.dtype)
            mean = (_masked_mean(w, mask, -1) * seq_valid).sum() / seq_valid.sum().clamp_min(1e-8)
        metrics["batch_norm_factor"] = mean.item() if mean > 1e-8 else 1.0
        if mean > 1e-8:
            w = w / mean
    return w, raw, metrics


def _filter_keep(option: str, threshold: str | float | tuple[float, float],
                 log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl rejection option ``option`` (token_k1 .. seq_max_k3): bool keep mask [B, R].

    Statistics come from the per-token log-ratio clamped to +-20, then summed, averaged or
    maxed over the response (verl's ``compute_rollout_rejection_mask``).
    """
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stat_kind = option.rsplit("_", 1)[1]
    tok = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}[stat_kind]
    scope = option.rsplit("_", 1)[0]
    if scope == "token":
        stat = tok
    elif scope == "seq_sum":
        stat = _masked_sum(tok, mask, -1)
    elif scope == "seq_mean":
        stat = _masked_mean(tok, mask, -1)
    else:  # seq_max
        vals = tok.masked_fill(mask <= 0, float("-inf")).max(-1).values
        stat = torch.where(torch.isinf(vals), torch.zeros_like(vals), vals)
    if stat_kind == "k1":
        lo, hi = parse_lo_hi(threshold)
        keep = (stat >= math.log(lo)) & (stat <= math.log(hi))
    else:
        keep = stat <= float(threshold)
    return keep if scope == "token" else keep.unsqueeze(-1).expand_as(mask)


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor,
                   spec: CorrectionSpec) -> tuple[torch.Tensor, dict[str, float]]:
    """Mask after RS and the divergence filters (AND, :func:`rejection_rules`) and the veto."""
    keep = torch.ones_like(mask, dtype=torch.bool)
    metrics: dict[str, float] = {}
    for option, threshold in rejection_rules(spec):
        keep &= _filter_keep(option, threshold, log_ratio, mask)
    valid = mask > 0
    seq_valid = valid.any(-1)
    if spec.rs != "off" or spec.rs_filters:
        metrics["rs_masked"] = _masked_mean((~keep).to(mask.dtype), mask).item()
        metrics["rs_seq_masked"] = (~keep & valid).any(-1).float().mean().item()
    if spec.veto is not None:  # a catastrophic token (pi_old/mu < veto) rejects its sequence
        bad = ((log_ratio < math.log(spec.veto)) & valid).any(-1)
        keep &= ~bad.unsqueeze(-1)
        metrics["vetoed"] = (bad.float().sum() / seq_valid.float().sum().clamp_min(1)).item()
    return mask * keep.to(mask.dtype), metrics


def apply_correction(logp_old: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor,
                     spec: CorrectionSpec) -> Correction:
    """IS weights, RS/filter/veto mask and loss denominator for one batch.

    In decoupled mode ``logp_old`` is the trainer's recompute; in bypass mode the caller passes
    the detached current policy (pi_old := mu, so the ratio is pi_theta / mu). Bypass with the
    PPO-clip loss computes IS weights for metrics only: the PPO ratio already carries them.
    """
    log_ratio = (logp_old - logp_mu).detach()
    w, raw, m_is = is_weights(log_ratio, mask, spec)
    loss_mask, m_rs = rejection_mask(log_ratio, mask, spec)
    denom = loss_mask if spec.denominator == "renormalized" else mask
    applied = spec.is_level != "none" and not (spec.policy == "bypass" and spec.loss_type == "ppo_clip")
    metrics = {**is_weight_stats(raw, w, mask, spec), **m_is, **m_rs}
    return Correction(w if applied else None, loss_mask, denom, metrics)


def empty_update(mask: torch.Tensor, loss_mask: torch.Tensor) -> str | None:
    """Why an update whose loss keeps ``loss_mask`` of the response ``mask`` has nothing to
    train on, or None. Such an update must not be taken: its token mean is 0/0 (verl: a NaN
    loss after a zero-gradient optimizer step) or a silent 0."""
    if bool((loss_mask != 0).any()):
        return None
    n = int((mask != 0).sum())
    if n == 0:
        return "no response token to train on (every response is empty)"
    return (f"every one of the {n} response tokens was rejected (RS, rs_filters or veto), so "
            "the update has nothing to train on")


def is_weight_stats(raw: torch.Tensor, w: torch.Tensor, mask: torch.Tensor,
                    spec: CorrectionSpec) -> dict[str, float]:
    """mean/std/min/max of the final weights, fraction of raw weights beyond bounds, ESS."""

    if spec.is_level == "none":
        return {}
    valid = mask > 0
    vals = w[valid].double()
    rv = raw[valid].double()
    n = max(vals.numel(), 1)
    # ESS of the final weights, as a fraction of n: (sum w)^2 / (n sum w^2).
    ess = (vals.sum() ** 2 / (n * (vals**2).sum())).item() if vals.numel() and vals.abs().sum() > 0 else 0.0
    return {
        "is_mean": vals.mean().item() if vals.numel() else 0.0,
        "is_std": vals.std(unbiased=False).item() if vals.numel() else 0.0,
        "is_min": vals.min().item() if vals.numel() else 0.0,
        "is_max": vals.max().item() if vals.numel() else 0.0,
        "is_frac_high": (rv > spec.is_hi).double().mean().item() if rv.numel() else 0.0,
        "is_frac_low": (rv < spec.is_lo).double().mean().item() if rv.numel() else 0.0,
        "ess": ess,
    }


def opsm_mask(logp_theta: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor,
              adv: torch.Tensor, delta: float) -> torch.Tensor:
    """DeepSeek-V3.2 off-policy sequence mask [B, 1]: 0 iff A < 0 and mean log(mu/pi) > delta."""
    drift = _masked_mean((logp_mu - logp_theta).detach(), mask, -1)
    return (~((adv < 0) & (drift > delta))).to(mask.dtype).unsqueeze(-1)


def policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                corr: Correction, spec: CorrectionSpec, clip_eps: float,
                extra_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean policy loss with the correction applied.

    ``logp_old`` is the PPO anchor: pi_old (decoupled) or mu (bypass). ``adv`` is [B] or [B, R].
    The denominator is the sum of ``corr.denom_mask``: tokens surviving RS (``renormalized``,
    verl) or all response tokens (``original``, Miles: rejected tokens shrink the gradient).
    """
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    mask = corr.loss_mask if extra_mask is None else corr.loss_mask * extra_mask
    w = corr.weights if corr.weights is not None else torch.ones_like(logp)
    if spec.policy == "bypass" and spec.loss_type == "reinforce":
        per_tok = -adv * w * logp
        clipped = torch.zeros_like(logp, dtype=torch.bool)
    else:
        ratio = torch.exp((logp - logp_old).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        un, cl = -adv * ratio, -adv * ratio.clamp(1 - clip_eps, 1 + clip_eps)
        per_tok = torch.maximum(un, cl) * w
        clipped = cl > un
    denom = corr.denom_mask.sum().clamp_min(1.0)
    loss = _masked_sum(per_tok, mask) / denom
    clipfrac = _masked_mean(clipped.to(mask.dtype), mask).item()
    return loss, {"pg_clipfrac": clipfrac}


# --------------------------------------------------------------------------- mismatch metrics

_CORRECTION_METRIC_NAMES = {
    "is_mean": "IS_MEAN", "is_std": "IS_STD", "is_min": "IS_MIN", "is_max": "IS_MAX",
    "ess": "IS_ESS", "is_frac_high": "IS_FRAC_HIGH", "is_frac_low": "IS_FRAC_LOW",
    "batch_norm_factor": "IS_BATCH_NORM", "is_masked": "IS_MASKED_FRACTION",
    "rs_masked": "RS_MASKED_FRACTION", "rs_seq_masked": "RS_SEQ_MASKED_FRACTION",
    "vetoed": "VETO_FRACTION",
}


def correction_metrics(corr: Correction) -> dict[str, float]:
    """``corr.metrics`` under the shared names of ``orchestrator.metrics``."""
    return {getattr(M, _CORRECTION_METRIC_NAMES[k]): v for k, v in corr.metrics.items()}


def mismatch_metrics(logp_old: torch.Tensor, logp_mu: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """k1, k3, log-PPL diff, PPLs, chi2 token/seq, TV, prob diff and k3 by rollout probability.

    Computed in float64 so that tiny mismatches (1e-9) are not lost to rounding.
    """
    old, mu, m = logp_old.double(), logp_mu.double(), mask.double()
    d = old - mu  # log rho, rho = pi_old / mu
    ds = d.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k3 = torch.exp(ds) - ds - 1.0
    seq_old, seq_mu = _masked_mean(old, m, -1), _masked_mean(mu, m, -1)
    seq_valid = m.sum(-1) > 0
    log_ppl_diff = (seq_mu - seq_old)[seq_valid]
    seq_sum = _masked_sum(d, m, -1)[seq_valid].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out = {
        M.K1_KL: _masked_mean(mu - old, m).item(),
        M.K3_KL: _masked_mean(k3, m).item(),
        M.LOG_PPL_DIFF: log_ppl_diff.mean().item(),
        M.LOG_PPL_ABS_DIFF: log_ppl_diff.abs().mean().item(),
        M.TRAINING_PPL: torch.exp(-seq_old[seq_valid]).mean().item(),
        M.ROLLOUT_PPL: torch.exp(-seq_mu[seq_valid]).mean().item(),
        M.CHI2_TOKEN: (_masked_mean(torch.exp(2 * ds), m) - 1.0).item(),
        M.CHI2_SEQ: (torch.exp(2 * seq_sum).mean() - 1.0).item(),
        M.TV: 0.5 * _masked_mean((torch.exp(ds) - 1.0).abs(), m).item(),
        M.PROB_DIFF_MEAN: _masked_mean((old.exp() - mu.exp()).abs(), m).item(),
    }
    p_mu = mu.exp()
    n_valid = m.sum().clamp_min(1.0)
    for lo, hi in M.PROB_BUCKETS:
        in_bucket = m * ((p_mu >= lo) & (p_mu < hi)).double()
        count = in_bucket.sum()
        out[M.bucket_count_name(lo, hi)] = (count / n_valid).item()
        if count > 0:  # an empty bucket has no mismatch to report (not 0, not NaN)
            out[M.bucket_name(lo, hi)] = (_masked_sum(k3, in_bucket) / count).item()
    return out
