"""In the verl job: report each rollout engine's effective settings as the engine resolved them.

verl 0.9.1 imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` in every process that
imports verl (``verl/__init__.py``), the rollout server actors included. Importing this module
there installs an import hook that, once the engine's own module is imported, wraps the point
where the engine settles its configuration:

* SGLang: ``sglang.srt.server_args.ServerArgs.__post_init__`` (verl builds ``ServerArgs(**args)``
  in the server actor, async_sglang_server.py; SGLang fills its defaults there);
* vLLM: ``vllm.engine.arg_utils.EngineArgs.create_engine_config`` (the ``VllmConfig`` the engine
  runs with, vllm_async_server.py ``run_server``).

Each report is one JSON line appended to ``$ABLATE_ENGINE_LOG`` (and printed with the marker
``ABLATE_ENGINE``); ``provenance`` compares it with the trial's flags. Nothing here
imports an engine; a failure to read a setting leaves it out of the report, never breaks the job.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

LOG_ENV = "ABLATE_ENGINE_LOG"
MARKER = "ABLATE_ENGINE"


def report(engine: str, version: str, settings: Mapping[str, Any]) -> None:
    """Write one engine report (the CPU engine calls this directly)."""
    line = json.dumps({"engine": engine, "version": version, "pid": os.getpid(),
                       "settings": {k: _plain(v) for k, v in settings.items()}}, sort_keys=True)
    print(f"{MARKER} {line}", flush=True)
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _pick(obj: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """{setting: obj.<dotted attr>} for the attributes this engine version has."""
    out = {}
    for setting, dotted in names.items():
        node = obj
        try:
            for part in dotted.split("."):
                node = getattr(node, part)
        except AttributeError:
            continue
        out[setting] = node
    return out


SGLANG_FIELDS = {n: n for n in (
    "dtype", "quantization", "kv_cache_dtype", "attention_backend", "disable_cuda_graph",
    "chunked_prefill_size", "enable_fp32_lm_head", "disable_radix_cache",
    "disable_overlap_schedule", "max_running_requests", "enable_deterministic_inference",
    "random_seed")}
# Attribute paths in vLLM's VllmConfig (tests/verl_cpu/test_vllm_cpu_facts.py reads each one in
# the installed vLLM). Chunked prefill is SchedulerConfig.enable_chunked_prefill in 0.32
# (config/scheduler.py:134) and in 0.24: the old chunked_prefill_enabled was a deprecated alias
# "removed in v0.12" (vllm-project/vllm config/scheduler.py, the property's @deprecated text).
VLLM_FIELDS = {
    "dtype": "model_config.dtype", "quantization": "model_config.quantization",
    "enforce_eager": "model_config.enforce_eager", "logprobs_mode": "model_config.logprobs_mode",
    "head_dtype": "model_config.head_dtype", "kv_cache_dtype": "cache_config.cache_dtype",
    "enable_prefix_caching": "cache_config.enable_prefix_caching",
    "enable_chunked_prefill": "scheduler_config.enable_chunked_prefill",
    "max_num_seqs": "scheduler_config.max_num_seqs",
    "async_scheduling": "scheduler_config.async_scheduling",
    "cudagraph_mode": "compilation_config.cudagraph_mode",
    "attention_backend": "attention_config.backend",
}


def _version(module_name: str) -> str:
    mod = sys.modules.get(module_name)
    return str(getattr(mod, "__version__", "unknown"))


def patch_sglang(module: ModuleType) -> None:
    cls = getattr(module, "ServerArgs", None)
    if cls is None or getattr(cls.__post_init__, "_ablate", False):
        return
    original = cls.__post_init__

    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _safe(lambda: report("sglang", _version("sglang"), _pick(self, SGLANG_FIELDS)))

    __post_init__._ablate = True  # type: ignore[attr-defined]
    cls.__post_init__ = __post_init__


def patch_vllm(module: ModuleType) -> None:
    cls = getattr(module, "EngineArgs", None)
    if cls is None or getattr(cls.create_engine_config, "_ablate", False):
        return
    original = cls.create_engine_config

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)

        def settings() -> dict[str, Any]:
            out = _pick(config, VLLM_FIELDS)
            hf = getattr(getattr(config, "model_config", None), "hf_overrides", None)
            if "head_dtype" not in out and isinstance(hf, Mapping) and "head_dtype" in hf:
                out["head_dtype"] = hf["head_dtype"]
            out["batch_invariant"] = os.environ.get("VLLM_BATCH_INVARIANT", "0")
            return out

        _safe(lambda: report("vllm", _version("vllm"), settings()))
        return config

    create_engine_config._ablate = True  # type: ignore[attr-defined]
    cls.create_engine_config = create_engine_config


def _safe(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a report must never break the engine
        print(f"{MARKER} report failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "sglang.srt.server_args": patch_sglang,
    "vllm.engine.arg_utils": patch_vllm,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _safe(lambda: self.patch(module))


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Finds the engine modules through the other finders and patches them once loaded."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def install() -> None:
    """Patch engine modules already imported, and the ones imported from now on (idempotent)."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            _safe(lambda n=name, p=patch: p(sys.modules[n]))
    if not any(isinstance(f, _PatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchFinder())


if os.environ.get(LOG_ENV):
    install()
