"""rl-ablate: declarative ablation grids for training-inference mismatch in LLM RL.

Everything the ``ablate`` CLI does is importable from here::

    from orchestrator import load_grid, expand
    grid = load_grid("grids/quickstart.yaml")
    trials = expand(grid)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import GridError, OrchestratorError, UserError
from orchestrator.trial import TrialSpec, TrialState

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec, expand, load_grid

_FROM_GRID = ("GridSpec", "expand", "load_grid")


def __getattr__(name: str) -> Any:
    """The grid API and the version on first use (PEP 562): a command that reads records
    (``ablate status``) need not import the grid schema, its validation library or the
    package-metadata reader."""
    if name == "__version__":
        import importlib.metadata

        try:  # one place: pyproject.toml's version, as the installed package's metadata says it
            version = importlib.metadata.version("rl-ablate")
        except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version
    if name in _FROM_GRID:
        from orchestrator import grid  # deferred: the reason is in the docstring

        return getattr(grid, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")

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
