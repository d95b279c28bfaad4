"""``ablate`` on the verl backend as a user runs it, for the tests of ``tests/verl_cpu/``: a
subprocess with its own workdir (``<tmp>/wd``), the repo's recipes, and no tracking URI, Ray
address or MLflow run inherited from the test session."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def env(tmp: Path) -> dict[str, str]:
    """The environment of ``ablate`` with workdir ``tmp/wd``."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "MLFLOW_RUN_ID")}
    out.update(ABLATE_WORKDIR=str(tmp / "wd"), ABLATE_RECIPES=str(REPO / "recipes"),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH")) if p))
    return out


def ablate(args: list[str], env: dict[str, str], cwd: Path,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``ablate args`` to its end, output captured."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
