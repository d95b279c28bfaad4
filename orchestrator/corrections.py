"""The mismatch-correction vocabulary shared by every backend, and (below) its math.

One vocabulary (a superset of Miles ``mis.yaml`` and verl 0.6-0.9, see
``research/corrections.md``) is declared in grids under ``correction.*``:

=================  ==========================================================================
key                meaning
=================  ==========================================================================
is_level           none | token | sequence | geometric: how the IS log-ratio is aggregated
is_mode            truncate (TIS, clamp above) | clip (clamp both sides) | mask (IcePop band)
is_bounds          [lo, hi] on the IS ratio; lo null means 1/hi
rs                 off | token | sequence | geometric: rejection sampling level
rs_bounds          [lo, hi] for RS; null means the IS bounds
rs_filters         {verl option: threshold}, e.g. {seq_mean_k3: 0.01, token_k1: "0.5_2.0"}
veto               per-token veto threshold on pi_old/mu (reject the sequence), or null
batch_norm         self-normalise IS weights to mean 1 over the batch
policy             decoupled (3-policy: pi_theta, pi_old, mu) | bypass (2-policy: pi_old := mu)
loss_type          ppo_clip | reinforce (bypass only)
denominator        renormalized (verl: token-mean over surviving tokens) | original (Miles)
opsm               DeepSeek-V3.2 off-policy sequence masking delta, or null
routing_replay     off | R2 | R3 (MoE only)
=================  ==========================================================================

The math below follows Miles ``mis.py`` and verl's ``rollout_corr_helper``. For every
specification the verl backend accepts, the weights, loss mask and denominator mask equal verl
0.9.1's (``tests/test_correction_parity.py`` runs the whole matrix through verl's own helper).
Where the references disagree or are silent, this vocabulary decides, explicitly:

- ``is_mode: mask`` zeroes the weight outside [lo, hi] and leaves the loss mask alone (verl's
  IcePop). Miles keeps the raw weight and drops the token from the mask but not from the
  denominator: the same loss without ``batch_norm``, a different one with it (next item).
- ``batch_norm`` divides by the batch mean of the weights *after* truncation or masking (verl),
  so in mask mode out-of-band tokens count as 0 in the mean. Miles' ``compute_mis_weights``
  averages the raw weights, out-of-band ones included (up to e^20), so its weights come out
  smaller by mean(raw) / mean(masked) >= 1: 1 when nothing is out of band, 1.06 at token level
  with 4% of the tokens out of [0.5, 2], ~1e7 as soon as one token reaches e^20. Not offered as
  an option: that factor is set by exactly the tokens the mask exists to ignore.
- ``batch_norm`` at geometric level normalises the per-sequence weights like sequence level
  (Miles raises).
- ``rs`` is verl's k1 rejection at that level (token_k1 / seq_sum_k1 / seq_mean_k1) with
  ``rs_bounds`` turned into verl's direction (:func:`rejection_rules`): every token's
  log-ratio is clamped to +-20 *before* it is summed or averaged, as in the ``rs_filters``.
- ``veto`` applies whether or not RS is on (Miles only vetoes inside its RS path).
- ``denominator``: ``renormalized`` divides by the tokens surviving RS/filters/veto (verl's
  decoupled mode), ``original`` by all response tokens (Miles, and verl's bypass mode, whose
  loss rejects tokens after the engine has counted them): rejected tokens shrink the gradient.
- Masked positions (padding, multi-turn holes) never reach a sum, a mean or a weight, even when
  they hold NaN or inf: :func:`_masked_sum` selects, it does not multiply (as verl does).
- An update with no token left in its loss (all rejected, or none generated) is not taken:
  :func:`empty_update` says why and the simulator fails the attempt as a numeric failure, as a
  verl job ends up doing (its helper raises on an empty batch; its token mean is then 0/0).
- ``opsm`` masks a sequence when A < 0 and mean_t log(mu / pi_theta) > delta (mu: the engine's
  sampling probability, as in DeepSeek-V3.2).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

IS_LEVELS = ("none", "token", "sequence", "geometric")
IS_MODES = ("truncate", "clip", "mask")
RS_LEVELS = ("off", "token", "sequence", "geometric")
RS_FILTER_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
SAFETY_BOUND = 20.0  # log-ratio clamp used by Miles and verl
# ``rs`` levels as verl's k1 rejection options (k1 = -log ratio, clamped per token).
RS_LEVEL_OPTION = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "null" if value is None else f"{value:g}"


def _check_bounds(value: tuple[float | None, float] | None, name: str) -> None:
    if value is None:
        return
    lo, hi = value
    for v in (lo, hi):
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"{name} must be finite and > 0, got {list(value)}")
    if lo is not None and lo > hi:
        raise ValueError(f"{name} lower bound {lo} is above the upper bound {hi}")


def band(bounds: tuple[float | None, float], key: str, effect: str = "") -> tuple[float, float]:
    """(lo, hi) of a bounds pair whose null lower bound means 1/hi.

    An implied lower bound above the upper one (hi < 1) is an empty band: ValueError, one line
    naming ``correction.<key>``, the value, the implied bound, ``effect`` and the fix.
    """
    lo, hi = bounds
    if lo is not None:
        return lo, hi
    if 1.0 / hi > hi:
        raise ValueError(
            f"correction.{key} {_show(list(bounds))}: the implied lower bound 1/{hi:g} = "
            f"{1.0 / hi:g} is above the upper bound {hi:g}{effect}; fix: correction.{key}: "
            f"[lo, {hi:g}] with lo <= {hi:g}, or an upper bound >= 1")
    return 1.0 / hi, hi


def parse_lo_hi(threshold: str | float | tuple[float, float]) -> tuple[float, float]:
    """verl's k1 threshold: ``"lo_hi"``, a bare upper bound (lo = 1/hi) or a (lo, hi) pair."""
    if isinstance(threshold, tuple):
        lo, hi = threshold
    elif isinstance(threshold, str) and "_" in threshold:
        lo_s, hi_s = threshold.split("_", 1)
        lo, hi = float(lo_s), float(hi_s)
    else:
        hi = float(threshold)
        if math.isfinite(hi) and 0 < hi < 1:
            raise ValueError(f"{threshold!r} is a k1 upper bound whose implied lower bound "
                             f"1/{hi:g} = {1.0 / hi:g} is above it, so every token would be "
                             f"rejected; fix: 'lo_{hi:g}' with lo <= {hi:g}, or an upper bound >= 1")
        lo = 1.0 / hi if hi > 0 else math.nan
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or lo > hi:
        raise ValueError(f"threshold {threshold!r} must be 'lo_hi' with 0 < lo <= hi")
    return lo, hi


class CorrectionSpec(BaseModel):
    """One point of the correction matrix, validated; ``canonical()`` drops irrelevant fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    is_level: Literal["none", "token", "sequence", "geometric"] = "none"
    is_mode: Literal["truncate", "clip", "mask"] = "truncate"
    is_bounds: tuple[float | None, float] = (0.5, 2.0)
    rs: Literal["off", "token", "sequence", "geometric"] = "off"
    rs_bounds: tuple[float | None, float] | None = None
    rs_filters: dict[str, str | float] = Field(default_factory=dict)
    veto: float | None = None
    batch_norm: bool = False
    policy: Literal["decoupled", "bypass"] = "decoupled"
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    denominator: Literal["renormalized", "original"] = "renormalized"
    opsm: float | None = None
    routing_replay: Literal["off", "R2", "R3"] = "off"

    @field_validator("is_bounds", "rs_bounds", mode="before")
    @classmethod
    def _bounds_from_list(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("rs_filters")
    @classmethod
    def _filters(cls, v: dict[str, str | float]) -> dict[str, str | float]:
        for opt, thr in v.items():
            if opt not in RS_FILTER_OPTIONS:
                raise ValueError(f"rs_filters option {opt!r} is not one of {list(RS_FILTER_OPTIONS)}")
            if opt.endswith("_k1"):
                try:
                    parse_lo_hi(thr)
                except ValueError as exc:
                    raise ValueError(f"correction.rs_filters.{opt}: {exc}") from None
            elif isinstance(thr, str) or not (math.isfinite(thr) and thr > 0):
                raise ValueError(f"rs_filters.{opt} takes one positive upper bound, got {thr!r}")
        return v

    @model_validator(mode="after")
    def _semantics(self) -> CorrectionSpec:
        _check_bounds(self.is_bounds, "is_bounds")
        _check_bounds(self.rs_bounds, "rs_bounds")
        # An implied lower bound (null -> 1/hi) above the upper one is an empty band; refused
        # where a lower bound is used (truncation uses only the upper bound).
        if self.rs != "off" and self.rs_bounds is None:
            band(self.is_bounds, "is_bounds", ", and RS uses the IS bounds while rs_bounds is "
                 "null, so it would reject every token")
        elif self.is_level != "none" and self.is_mode in ("mask", "clip"):
            band(self.is_bounds, "is_bounds", f", so {self.is_mode} mode would " + (
                "zero every weight" if self.is_mode == "mask"
                else f"set every weight to {self.is_hi:g}"))
        if self.rs != "off" and self.rs_bounds is not None:
            band(self.rs_bounds, "rs_bounds", ", so RS would reject every token")
        if self.veto is not None and not (math.isfinite(self.veto) and 0 < self.veto < 1):
            raise ValueError(f"veto must be in (0, 1), got {self.veto}")
        if self.opsm is not None and not (math.isfinite(self.opsm) and self.opsm >= 0):
            raise ValueError(f"opsm must be a finite delta >= 0, got {self.opsm}")
        if self.loss_type == "reinforce" and self.policy != "bypass":
            raise ValueError("loss_type reinforce only applies with policy: bypass")
        return self

    @property
    def is_lo(self) -> float:
        lo, hi = self.is_bounds
        return 1.0 / hi if lo is None else lo

    @property
    def is_hi(self) -> float:
        return self.is_bounds[1]

    @property
    def rs_lo_hi(self) -> tuple[float, float]:
        """The RS band on the ratio pi_old/mu: rs_bounds, else the IS bounds."""
        return band(self.is_bounds if self.rs_bounds is None else self.rs_bounds, "rs_bounds")

    def canonical(self) -> CorrectionSpec:
        """Reset fields that cannot change the result, so equivalent configs hash the same."""
        default = CorrectionSpec()
        update: dict[str, Any] = {}
        if self.is_level == "none":
            update.update(is_mode=default.is_mode, batch_norm=False)
            if self.rs == "off":
                update["is_bounds"] = default.is_bounds
        if self.rs == "off":
            update["rs_bounds"] = None
        if self.policy == "decoupled":
            update["loss_type"] = default.loss_type
        return self.model_copy(update=update) if update else self

    def non_default(self) -> dict[str, Any]:
        """Fields that differ from the defaults, as JSON-safe values (for overrides and hashing)."""
        out: dict[str, Any] = {}
        for name, value in self:
            if value != CorrectionSpec.model_fields[name].get_default(call_default_factory=True):
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


# --------------------------------------------------------------------------- the math
# torch is imported inside the functions: `ablate plan` imports this module and must stay light.
# Shapes: [B, R] per response token; `mask` is the response mask (1 = generated token).

if TYPE_CHECKING:
    import torch


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
    import torch

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
    import torch

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


def rejection_rules(spec: CorrectionSpec) -> list[tuple[str, str | float | tuple[float, float]]]:
    """RS and filters as verl rejection options with their thresholds, in the order given to
    verl: the ``rs`` level first, as its k1 option with the band turned into verl's direction
    (k1 = -log ratio, so keeping the ratio in [lo, hi] keeps k1 in [log 1/hi, log 1/lo]), then
    the filters by name. The simulator rejects with these and the verl mapping emits them."""
    rules: list[tuple[str, str | float | tuple[float, float]]] = []
    if spec.rs != "off":
        lo, hi = spec.rs_lo_hi
        rules.append((RS_LEVEL_OPTION[spec.rs], (1.0 / hi, 1.0 / lo)))
    return rules + sorted(spec.rs_filters.items())


def _filter_keep(option: str, threshold: str | float | tuple[float, float],
                 log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl rejection option ``option`` (token_k1 .. seq_max_k3): bool keep mask [B, R].

    Statistics come from the per-token log-ratio clamped to +-20, then summed, averaged or
    maxed over the response (verl's ``compute_rollout_rejection_mask``).
    """
    import torch

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
    import torch

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
    import torch

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
    from orchestrator import metrics as M

    return {getattr(M, _CORRECTION_METRIC_NAMES[k]): v for k, v in corr.metrics.items()}


def mismatch_metrics(logp_old: torch.Tensor, logp_mu: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """k1, k3, log-PPL diff, PPLs, chi2 token/seq, TV, prob diff and k3 by rollout probability.

    Computed in float64 so that tiny mismatches (1e-9) are not lost to rounding.
    """
    import torch

    from orchestrator import metrics as M

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
