"""Per engine, 2 real GRPO steps on one GPU and what the engine reported it ran with.

Needs a node with >= 1 GPU, the engine's stack (``ablate gpu-env sglang`` / ``ablate gpu-env
vllm``, then that environment's ``pip install pytest pytest-timeout``; recipes/verl/README.md), and ``$ABLATE_SMOKE_MODEL`` set to a local model
directory (recipes/verl/README.md). Run with ``pytest -m gpu tests/verl/test_engine_gpu.py``.
Not run in CPU CI: this is what only a GPU shows (docs/engines.md).
"""
from __future__ import annotations

import importlib.util
from typing import Any

import pytest

FLAGS = {"rollout.enforce_eager": True, "rollout.chunked_prefill": False,
         "rollout.max_num_seqs": 64, "rollout.provenance": "strict"}
# The engine setting each requested flag shows up as (verl.provenance.RENAMES / tables).
SHOWN = {"sglang": {"disable_cuda_graph": "true", "chunked_prefill_size": "-1",
                    "max_running_requests": "64"},
         "vllm": {"enforce_eager": "true", "enable_chunked_prefill": "false",
                  "max_num_seqs": "64"}}


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_two_steps_per_engine_record_what_the_engine_ran_with(tmp_path: Any, engine: str) -> None:
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed on this GPU node")
    from verl_smoke import run_smoke

    result = run_smoke(tmp_path, steps=2, rollout={"rollout.engine": engine, **FLAGS})
    assert result["returncode"] == 0, result["stderr"][-4000:]
    assert result["steps"] == [1, 2]
    (attempt,) = result["attempts"]["attempts"]
    env = attempt["environment"]
    assert env["engine.name"] == engine and env["verl.rollout"] == engine
    assert env["engine.version"] not in ("unreported", "unknown")
    assert env["engine.unapplied"] == "none" and env["engine.unconfirmed"] == "none", env
    for setting, value in SHOWN[engine].items():
        assert env[f"engine.ran.{setting}"] == value, (setting, env)
    print(f"\n{engine}: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())
                                      if k.startswith("engine.")))
