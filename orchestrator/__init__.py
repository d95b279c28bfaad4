"""rl-ablate: declarative ablation grids for training-inference mismatch in LLM RL.

Everything the ``ablate`` CLI does is importable from here::

    from orchestrator import load_grid, expand
    grid = load_grid("grids/quickstart.yaml")
    trials = expand(grid)
"""
from __future__ import annotations

import importlib.metadata as _metadata

try:  # one place: pyproject.toml's version, as the installed package's metadata says it
    __version__ = _metadata.version("rl-ablate")
except _metadata.PackageNotFoundError:  # a source tree imported without installing it
    __version__ = "0+unknown"

from orchestrator.exceptions import GridError, OrchestratorError, UserError
from orchestrator.grid import GridSpec, expand, load_grid
from orchestrator.trial import TrialSpec, TrialState

__all__ = [
    "GridError",
    "GridSpec",
    "OrchestratorError",
    "TrialSpec",
    "TrialState",
    "UserError",
    "__version__",
    "expand",
    "load_grid",
]
