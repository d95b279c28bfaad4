#!/usr/bin/env python3
"""Create a GPU stack's environment from a checkout, before anything is installed:

    python3 scripts/gpu_env.py sglang|vllm|miles [--env DIR] [--show]

The setup is ``orchestrator/verl/gpu_setup.py`` (standard library only), run here as a file so
that nothing of the project is imported; an installed rl-ablate runs the same code as
``ablate gpu-env``.
"""
import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "orchestrator" / "verl" /
                       "gpu_setup.py"), run_name="__main__")
