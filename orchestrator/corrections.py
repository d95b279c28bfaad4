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
"""
from __future__ import annotations

import math
from typing import Any, Literal

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


def _check_bounds(value: tuple[float | None, float] | None, name: str) -> None:
    if value is None:
        return
    lo, hi = value
    for v in (lo, hi):
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"{name} must be finite and > 0, got {list(value)}")
    if lo is not None and lo > hi:
        raise ValueError(f"{name} lower bound {lo} is above the upper bound {hi}")


def parse_lo_hi(threshold: str | float) -> tuple[float, float]:
    """verl's threshold syntax: ``"lo_hi"`` or a bare upper bound (lo = 1/hi)."""
    if isinstance(threshold, str) and "_" in threshold:
        lo_s, hi_s = threshold.split("_", 1)
        lo, hi = float(lo_s), float(hi_s)
    else:
        hi = float(threshold)
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
                parse_lo_hi(thr)
            elif isinstance(thr, str) or not (math.isfinite(thr) and thr > 0):
                raise ValueError(f"rs_filters.{opt} takes one positive upper bound, got {thr!r}")
        return v

    @model_validator(mode="after")
    def _semantics(self) -> CorrectionSpec:
        _check_bounds(self.is_bounds, "is_bounds")
        _check_bounds(self.rs_bounds, "rs_bounds")
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
        if self.rs_bounds is None:
            return self.is_lo, self.is_hi
        lo, hi = self.rs_bounds
        return (1.0 / hi if lo is None else lo), hi

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
