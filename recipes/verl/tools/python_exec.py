"""The Python tool of the Qwen3-14B TIR recipe, loaded by verl via
``actor_rollout_ref.rollout.multi_turn.function_tool_path`` (verl 0.9.1 ``@function_tool``).

Model-written code runs in a separate, isolated interpreter (``python -I``) with a time limit,
address-space and output limits, in a fresh temporary directory. This is a resource fence, not
a security sandbox: on shared clusters point the recipe at a sandbox service instead.
"""
from __future__ import annotations

import resource
import subprocess
import sys
import tempfile

from verl.tools.function_tool import function_tool

TIMEOUT_SECONDS = 10
MEMORY_BYTES = 2 << 30
MAX_OUTPUT_CHARS = 2000


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (TIMEOUT_SECONDS, TIMEOUT_SECONDS))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@function_tool("code_interpreter")
def code_interpreter(code: str) -> str:
    """Run a Python 3 program and return what it prints (stdout, then stderr).

    Args:
        code: A complete Python program. Use print() to show results.
    """
    with tempfile.TemporaryDirectory(prefix="tir-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd, text=True,
                                  capture_output=True, timeout=TIMEOUT_SECONDS,
                                  preexec_fn=_limits, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return f"Error: the program ran longer than {TIMEOUT_SECONDS} s and was stopped."
    out = proc.stdout + (("\n" + proc.stderr) if proc.stderr else "")
    if len(out) > MAX_OUTPUT_CHARS:
        out = out[:MAX_OUTPUT_CHARS] + "\n... (output truncated)"
    return out or "(no output)"
