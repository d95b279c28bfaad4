"""Run by a GPU stack's own Python (``ablate gpu-env sglang|vllm``) for tests/verl/test_engine_contract.py.

Input (stdin, JSON): ``{"engine": "sglang"|"vllm", "cases": {name: [verl override, ...]}}``,
each list a trial's verl overrides as ``ablate plan --show-overrides --json`` emits them.
Output (stdout, last line, JSON): per case ``{"reports": [engine report, ...], "stage": str,
"error": str|None}`` plus ``"versions"``, ``"fields"`` (the installed classes' fields),
``"facts"`` and ``"logprobs"`` (the engine's sampler run on small logits,
``logprob_semantics_probe.py``).

Per case, on verl 0.9.1's own code path: the overrides are composed in verl's Hydra config
(``orchestrator.verl.preflight``), the rollout server class verl makes a Ray actor of
(``SGLangHttpServer`` / ``vLLMHttpServer``) is built with its own ``__init__`` from the composed
``actor_rollout_ref.rollout`` and ``.model`` (the model path replaced by the tiny local Qwen2 of
``orchestrator.verl.cpu.assets``), and its ``launch_server`` runs until the engine's
configuration is settled:

* SGLang: verl's ``ServerArgs(**args)`` (SGLang's ``__post_init__`` fills its defaults there);
  the process launch after it (``Engine._launch_subprocesses``) is replaced by a stop.
* vLLM: verl parses its CLI arguments and ``run_server`` builds ``AsyncEngineArgs.from_cli_args``;
  ``create_engine_config`` (the ``VllmConfig``) needs a CUDA device: without one the stage
  reached and vLLM's error are returned with the ``EngineArgs`` fields.

The project's engine hook (``orchestrator.verl.engine_hook``) is installed as in a job, so the
reports are what a GPU trial records; where vLLM stops before its hook, the ``EngineArgs`` that
``create_engine_config`` would read are reported under the hook's setting names instead.
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path


class Stop(Exception):
    """Raised where the engine would start processes or touch a device."""


class _NoDevice:
    """What sgl_kernel's names are without a GPU: anything that calls one fails loudly."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a CUDA kernel: it needs a GPU")

    def __getattr__(self, attr: str) -> _NoDevice:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NoDevice(f"{self._name}.{attr}")


def _vllm_device() -> str | None:
    """vLLM's argument parser builds a ``DeviceConfig`` for its defaults, whose ``device: auto``
    asks the platform (config/device.py ``__post_init__``): no GPU, no platform, a RuntimeError
    before any argument is read. That one inference is answered "cuda" where it finds nothing;
    every other check is vLLM's own. Returns what was replaced, or None where a GPU answers."""
    from vllm.config import device
    from vllm.platforms import current_platform

    if current_platform.device_type:
        return None
    original = device.DeviceConfig.__post_init__

    def __post_init__(self):
        if self.device == "auto":
            self.device = "cuda"
        original(self)

    device.DeviceConfig.__post_init__ = __post_init__
    return "DeviceConfig's device inference needs a GPU: answered cuda here"


def _without_cuda_kernels() -> str | None:
    """SGLang's kernel package (sgl_kernel) loads libcuda.so.1, the GPU driver, when imported;
    verl's SGLang server imports it through sglang's engine modules. Where the driver is absent
    it is replaced by modules whose every name raises when called (nothing here runs a kernel:
    the probe stops at ServerArgs). Returns why, or None where the real one imports."""
    try:
        import sgl_kernel  # noqa: F401
        return None
    except ImportError as exc:
        if "libcuda" not in str(exc):
            raise
    import importlib.abc
    import importlib.machinery
    import types

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "sgl_kernel" or name.startswith("sgl_kernel."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = lambda attr: _NoDevice(spec.name).__getattr__(attr)
            return module

        def exec_module(self, module):
            pass

    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, Finder())
    return "sgl_kernel needs libcuda.so.1 (a GPU driver): its kernels are stand-ins here"


def _composed(overrides: list[str], model_dir: Path):
    from orchestrator.verl.preflight import compose, verl_config_dir

    keep = [o for o in overrides if not o.lstrip("+").startswith("actor_rollout_ref.model.path=")]
    with verl_config_dir(cache=False):
        cfg = compose([*keep, f"actor_rollout_ref.model.path={model_dir}"])
    return cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model


def _sglang(rollout, model, report) -> str:
    from sglang.srt.entrypoints import http_server
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.sglang_rollout import async_sglang_server as server

    def stop(*args, **kwargs):
        raise Stop("ServerArgs built; Engine._launch_subprocesses not run (processes, GPU)")

    real = server.ServerArgs

    class ServerArgs(real):  # SGLang's own dataclass: its __init__ refuses an unknown field
        def __post_init__(self):
            try:
                super().__post_init__()  # SGLang's defaults; the hook reports from there
            except Exception as exc:  # noqa: BLE001 - a check that needs a device
                from orchestrator.verl.engine_hook import SGLANG_FIELDS

                report({"engine": "sglang", "version": importlib.metadata.version("sglang"),
                        "settings": {k: getattr(self, k) for k in SGLANG_FIELDS
                                     if hasattr(self, k)}})
                raise Stop(f"ServerArgs fields accepted; __post_init__ needs a GPU "
                           f"({type(exc).__name__}: {str(exc)[:160]})") from None

    server.ServerArgs = ServerArgs
    http_server.Engine._launch_subprocesses = staticmethod(stop)
    try:
        s = server.SGLangHttpServer(rollout, model, RolloutMode.HYBRID, [], 0, 0, 1, "0", 0)
        asyncio.run(s.launch_server())
    finally:
        server.ServerArgs = real
    return "launched"  # not reached: the stop above


def _vllm(rollout, model, report) -> str:
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout import vllm_async_server as server
    from vllm.engine.arg_utils import AsyncEngineArgs

    s = server.vLLMHttpServer(rollout, model, RolloutMode.HYBRID, [], 0, 0,
                              rollout.tensor_model_parallel_size, 1, "0")
    seen = {}

    async def run_server(args):
        seen["args"] = AsyncEngineArgs.from_cli_args(args)
        raise Stop("AsyncEngineArgs built from verl's CLI arguments")

    s.run_server = run_server
    try:
        asyncio.run(s.launch_server())
    except Stop:
        pass
    engine_args = seen["args"]
    try:
        engine_args.create_engine_config()  # the hook reports the VllmConfig here
        return "VllmConfig built"
    except Exception as exc:  # noqa: BLE001 - without a device vLLM stops here
        report(_vllm_engine_args(engine_args))
        return f"EngineArgs built; create_engine_config needs a GPU ({type(exc).__name__}: " \
               f"{str(exc)[:160]})"


def _vllm_engine_args(a) -> dict:
    """The EngineArgs fields ``create_engine_config`` copies into the VllmConfig paths the hook
    reads (engine_hook.VLLM_FIELDS), under the hook's names."""
    from orchestrator.verl.engine_hook import VLLM_FIELDS

    compilation = a.compilation_config
    mode = getattr(compilation, "cudagraph_mode", None)
    if isinstance(compilation, dict):
        mode = compilation.get("cudagraph_mode")
    out = {name: getattr(a, name) for name in VLLM_FIELDS if hasattr(a, name)}
    out["kv_cache_dtype"] = a.kv_cache_dtype
    out["cudagraph_mode"] = mode
    hf = a.hf_overrides if isinstance(a.hf_overrides, dict) else {}
    if "head_dtype" in hf:
        out["head_dtype"] = hf["head_dtype"]
    return {"engine": "vllm", "version": importlib.metadata.version("vllm"),
            "settings": {k: v if isinstance(v, (bool, int, float, str, type(None), dict, list))
                         else str(v) for k, v in out.items()}}


def _fields(engine: str) -> dict[str, list[str]]:
    """The installed classes' field names: what the hook's paths must exist in."""
    if engine == "sglang":
        from sglang.srt.server_args import ServerArgs

        return {"ServerArgs": [f.name for f in dataclasses.fields(ServerArgs)]}
    from vllm.config import VllmConfig

    out = {"VllmConfig": [f.name for f in dataclasses.fields(VllmConfig)]}
    for f in dataclasses.fields(VllmConfig):
        typ = f.type if not isinstance(f.type, str) else None
        cls = typ if typ is not None and dataclasses.is_dataclass(typ) else None
        if cls is None:
            try:
                cls = type(f.default_factory()) if f.default_factory is not dataclasses.MISSING \
                    else None
            except Exception:  # noqa: BLE001 - a factory that needs a device
                cls = None
        if cls is not None and dataclasses.is_dataclass(cls):  # fields and properties
            out[f.name] = [g.name for g in dataclasses.fields(cls)] + [
                n for n in dir(cls) if isinstance(getattr(cls, n, None), property)]
    from vllm.engine.arg_utils import EngineArgs

    out["EngineArgs"] = [f.name for f in dataclasses.fields(EngineArgs)]
    return out


def _facts(engine: str) -> dict:
    """What the plan's refusals for this engine rest on, read from the installed code."""
    import inspect

    import verl

    vllm_server = Path(verl.__file__).parent / "workers/rollout/vllm_rollout/vllm_async_server.py"
    if engine == "sglang":
        from sglang.srt.server_args import ServerArgs
        from verl.workers.rollout.sglang_rollout import async_sglang_server as sglang_server

        names = {f.name for f in dataclasses.fields(ServerArgs)}
        return {"server_args_cudagraph_fields": sorted(n for n in names if "cudagraph" in n),
                "verl_sglang_passes_logprobs_mode":
                    "logprobs_mode" in inspect.getsource(sglang_server.SGLangHttpServer.launch_server),
                "verl_vllm_passes_logprobs_mode": "logprobs_mode" in vllm_server.read_text()}
    from vllm.model_executor.layers import logits_processor
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return {"logits_processor_reads_head_dtype": "head_dtype" in inspect.getsource(logits_processor),
            "attention_backends": sorted(m.name for m in AttentionBackendEnum)}


def main() -> None:
    request = json.loads(sys.stdin.read())
    engine = request["engine"]
    from orchestrator.verl import engine_hook
    from orchestrator.verl.cpu import assets

    work = Path(tempfile.mkdtemp(prefix="engine-contract-"))
    model_dir = assets.build(cache_root=work / "assets").model_dir
    log = work / "engine.jsonl"
    os.environ[engine_hook.LOG_ENV] = str(log)
    engine_hook.install()

    def report(record: dict) -> None:
        with log.open("a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    kernels = _without_cuda_kernels() if engine == "sglang" else _vllm_device()
    out: dict = {"kernels": kernels, "versions": {p: importlib.metadata.version(p) for p in ("verl", engine)},
                 "fields": _fields(engine), "facts": _facts(engine), "cases": {}}
    for name, overrides in request["cases"].items():
        log.write_text("")
        stage, error = "", None
        try:
            rollout, model = _composed(overrides, model_dir)
            stage = (_sglang if engine == "sglang" else _vllm)(rollout, model, report)
        except Stop as stop:
            stage = str(stop)
        except Exception as exc:  # noqa: BLE001 - the engine refused: the test shows it
            error = f"{type(exc).__name__}: {exc}"[:400]
            stage = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)[::-1][:8])
        reports = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        out["cases"][name] = {"reports": reports, "stage": stage, "error": error}
    import logprob_semantics_probe  # beside this file: the script's folder is on sys.path

    out["logprobs"] = logprob_semantics_probe.run(engine)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
