"""Numeric profile of the simulator's rollout engine (torch-free: used at plan time).

A ``sim-*`` pool carries a ``sim_profile`` mapping; grid ``rollout.*`` flags override it. The
resolved :class:`Numerics` says how the rollout engine computes mu. See ``README.md`` here for
what each knob emulates and how the pools were calibrated.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.engine import DTYPES, ENGINE_ONLY_FLAGS, RolloutSpec
from orchestrator.exceptions import UserError, did_you_mean

Dtype = Literal["fp32", "bf16", "fp16", "fp8"]
Reduction = Literal["default", "reversed", "chunked"]

# rollout.* flags that have no arithmetic counterpart in the simulator: refused, never ignored.
UNSUPPORTED_FLAGS = ("enforce_eager", "free_cache_engine", "attention_backend",
                     "sampling_seed_per_request", *ENGINE_ONLY_FLAGS)


class SimProfile(BaseModel):
    """The ``sim_profile`` of a pool: rollout-engine arithmetic (the trainer is always fp32)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Dtype = "bf16"  # weights + activations of every linear, residual stream, attention
    lm_head: Dtype = "bf16"  # LM head matmul and the logits it returns
    kv_cache: Dtype = "bf16"  # K/V are stored (rounded) in this dtype
    router: Dtype | None = None  # MoE router logits; None = same as dtype (bf16 when dtype fp8)
    reduction_order: Reduction = "default"  # default | reversed K | chunked split-K
    split_k: int = Field(16, ge=1, le=4096)  # chunk of the split-K reduction (chunked only)
    weight_quant: Literal["none", "int4"] = "none"  # int4: W4A16 group-quantised weights
    group_size: int = Field(32, ge=1, le=4096)  # int4 quantisation group along the input dim
    weight_lag: int = Field(0, ge=0, le=64)  # steps the engine's weights trail the trainer
    chunked_prefill: int = Field(0, ge=0, le=4096)  # prefill chunk (tokens); 0 = whole prompt


class Numerics(BaseModel):
    """Resolved rollout arithmetic of one trial (profile + ``rollout.*`` overrides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Dtype
    lm_head: Dtype
    kv_cache: Dtype
    router: Dtype
    reduction_order: Reduction
    split_k: int
    weight_quant: Literal["none", "int4"]
    group_size: int
    weight_lag: int
    chunked_prefill: int
    deterministic: bool
    temperature: float

    @property
    def exact(self) -> bool:
        """True when the engine computes exactly like the fp32 trainer (trainer's shapes)."""
        return self.deterministic


def parse_profile(raw: Mapping[str, Any], pool: str) -> SimProfile:
    """Validate a pool's ``sim_profile``; a bad key or value is a UserError naming it."""
    for key in raw:
        if key not in SimProfile.model_fields:
            hint = did_you_mean(key, list(SimProfile.model_fields))
            raise UserError(
                f"pool {pool}: sim_profile.{key} is not a simulator knob; allowed: "
                f"{', '.join(SimProfile.model_fields)}" + (f"; did you mean {hint!r}?" if hint else ""))
    try:
        return SimProfile.model_validate(dict(raw))
    except ValidationError as exc:
        raise UserError(f"pool {pool}: {explain(exc, 'sim_profile')}; "
                        f"dtypes are {', '.join(DTYPES)}") from None


def explain(exc: ValidationError, section: str) -> str:
    """One line for the first pydantic error: ``section.key: problem (got value)``. Shared by
    ``parse_profile`` and ``config.build_setup``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (section, *err["loc"]))
    return f"{loc}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})"


def resolve_numerics(profile: SimProfile, rollout: RolloutSpec) -> Numerics:
    """Apply the grid's ``rollout.*`` flags on top of the pool profile."""
    dtype = rollout.dtype or profile.dtype
    if rollout.lm_head_fp32 is True:
        lm_head = "fp32"
    elif rollout.lm_head_fp32 is False and profile.lm_head == "fp32":
        lm_head = dtype if dtype in ("bf16", "fp16") else "bf16"  # a low-precision head
    else:
        lm_head = profile.lm_head
    router = profile.router or ("bf16" if dtype == "fp8" else dtype)
    prefill = profile.chunked_prefill
    if rollout.chunked_prefill is not None:
        prefill = (profile.chunked_prefill or 4) if rollout.chunked_prefill else 0
    return Numerics(
        dtype=dtype, lm_head=lm_head, kv_cache=rollout.kv_cache_dtype or profile.kv_cache,
        router=router, reduction_order=rollout.reduction_order or profile.reduction_order,
        split_k=profile.split_k, weight_quant=profile.weight_quant, group_size=profile.group_size,
        # deterministic = the trainer's arithmetic *and* weights: the pool's lag is dropped,
        # an explicit rollout.weight_lag (async off-policy on purpose) is kept.
        weight_lag=(rollout.weight_lag if rollout.weight_lag is not None
                    else 0 if rollout.deterministic else profile.weight_lag),
        chunked_prefill=prefill, deterministic=bool(rollout.deterministic),
        temperature=1.0 if rollout.temperature is None else rollout.temperature)


def check_rollout(rollout: RolloutSpec, profile_raw: Mapping[str, Any], pool: str) -> str | None:
    """Plan-time reason the simulator cannot honour these flags on this pool, or None."""
    for flag in UNSUPPORTED_FLAGS:
        if getattr(rollout, flag) is not None:
            return (f"rollout.{flag} has no arithmetic counterpart in the CPU simulator "
                    "(it would change nothing); run it on the verl backend")
    if rollout.deterministic:
        clash = [f for f in ("dtype", "lm_head_fp32", "kv_cache_dtype", "reduction_order",
                             "chunked_prefill") if getattr(rollout, f) is not None]
        if clash:
            return (f"rollout.deterministic computes exactly like the fp32 trainer, so "
                    f"rollout.{clash[0]} cannot apply; drop one of them")
    try:
        profile = parse_profile(profile_raw, pool)
    except UserError as exc:
        return str(exc)
    dtype = rollout.dtype or profile.dtype
    if profile.weight_quant == "int4" and dtype not in ("bf16", "fp16") and not rollout.deterministic:
        return (f"pool {pool}: sim_profile.weight_quant int4 is W4A16 and needs a bf16/fp16 "
                f"rollout dtype, got {dtype}")
    return None
