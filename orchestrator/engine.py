"""Engine-flag vocabulary (``rollout.*`` in grids): how the rollout engine computes mu.

Every flag defaults to ``None`` = "whatever the pool / backend does by default". Backends map the
flags they can express (the simulator emulates the numerics; verl maps to SGLang kwargs) and
refuse the rest at plan time.
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

DTYPES = ("fp32", "bf16", "fp16", "fp8")


class RolloutSpec(BaseModel):
    """Rollout-engine flags of one trial."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    lm_head_fp32: bool | None = None
    kv_cache_dtype: Literal["fp32", "bf16", "fp16", "fp8"] | None = None
    deterministic: bool | None = None
    weight_lag: int | None = None
    reduction_order: Literal["default", "reversed", "chunked"] | None = None
    temperature: float | None = None
    chunked_prefill: bool | None = None
    enforce_eager: bool | None = None
    free_cache_engine: bool | None = None
    attention_backend: Literal["fa3", "flashinfer", "triton", "torch_native"] | None = None
    sampling_seed_per_request: bool | None = None

    @model_validator(mode="after")
    def _semantics(self) -> RolloutSpec:
        if self.weight_lag is not None and not 0 <= self.weight_lag <= 64:
            raise ValueError(f"weight_lag must be in 0..64 steps, got {self.weight_lag}")
        if self.temperature is not None and not (
            math.isfinite(self.temperature) and 0 < self.temperature <= 10
        ):
            raise ValueError(f"temperature must be in (0, 10], got {self.temperature}")
        return self

    def non_default(self) -> dict[str, Any]:
        return {k: v for k, v in self if v is not None}
