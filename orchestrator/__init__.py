"""rl-ablate: declarative ablation grids for training-inference mismatch in LLM RL.

Everything the ``ablate`` CLI does is importable from here::

    from orchestrator import load_grid, expand
    grid = load_grid("grids/quickstart.yaml")
    trials = expand(grid)
"""
from __future__ import annotations

__version__ = "0.1.0"

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
