"""Where a grid's results are, when the MLflow store ``compare`` was pointed at holds none."""
from __future__ import annotations

from pathlib import Path

from orchestrator.grid import GridSpec
from orchestrator.scheduler import stored_stores
from orchestrator.store import TrialPaths, records


def where_recorded(grid: GridSpec, grid_dir: Path, here: str) -> str:
    """Where a grid's results are when the store asked holds none: the workdir's finished
    trials, the stores the grid was submitted to, and the command that copies them here."""
    finished = [tid for tid in (records.trial_ids(grid_dir) if (grid_dir / "trials").is_dir() else [])
                if records.load_state(TrialPaths(grid_dir, tid), tid).state.is_finished()]
    if not finished:
        return "fix: run `ablate submit` first or pass the --tracking-uri it ran with"
    others = [s for s in stored_stores(grid_dir) if s != here]
    where = f" (recorded in {', '.join(others)})" if others else ""
    return (f"the workdir {grid_dir.parent} holds {len(finished)} finished trial(s) of it{where}; "
            f"fix: pass the --tracking-uri they ran with, or copy them here with "
            f"`ablate publish {grid.file} --tracking-uri {here}`")
