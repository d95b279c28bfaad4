"""``ablate status`` and ``ablate cancel``: read and steer a grid from any process.

Both work from the grid's files alone, so they answer whether or not an orchestrator runs the
grid. Cancelling a trial nobody runs marks it CANCELLED at once (under its run lock) and has its
backend stop what a killed orchestrator left behind (a Slurm job); a running trial is asked to
stop through ``cancel.json`` and its runner ends the attempt within a step.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from orchestrator import backends
from orchestrator.exceptions import UserError, did_you_mean, no_such_trial
from orchestrator.safeyaml import load_yaml
from orchestrator.scheduler._progress import collect, render
from orchestrator.store import TrialPaths, active_holder, records, workspace
from orchestrator.store.records import mark_cancelled


def _resolve_grid_dir(grid: str, workdir: str | None) -> Path:
    """``grid`` is a grid file or a grid name; its directory must exist in the workdir."""
    name = grid
    if grid.endswith((".yaml", ".yml")) or os.path.sep in grid:
        name = _declared_name(grid, workdir) or _composed_name(grid)
    grid_dir = workspace.grid_dir(name, workdir)
    if not (grid_dir / "trials").is_dir():
        known = [Path(p).parent.name for p in map(str, workspace.workdir(workdir).glob("*/trials"))]
        hint = did_you_mean(name, known)
        raise UserError(f"grid {name!r} has no runs in {workspace.workdir(workdir)}"
                        + (f"; did you mean {hint!r}?" if hint else "; start it with `ablate submit GRID_FILE`"))
    return grid_dir


def _composed_name(path: str) -> str:
    """The name of a grid file that names no grid of the workdir: composed with Hydra, which
    explains what is wrong with the file (the grid package is imported for this only)."""
    from orchestrator.grid import load_grid  # deferred: see the docstring

    return load_grid(path).name


def _declared_name(path: str, workdir: str | None) -> str | None:
    """The ``name:`` a grid file declares, when the workdir has that grid: the trials' files are
    what status reads, so composing the grid (Hydra, a third of status's time at 1,000 trials)
    is needed only to explain a file that names no grid here."""
    try:
        name = load_yaml(path)[0].get("name")
    except (OSError, ValueError):
        return None
    ok = isinstance(name, str) and name and (workspace.grid_dir(name, workdir) / "trials").is_dir()
    return name if ok else None


def status_command(grid: str | None, *, workdir: str | None = None, as_json: bool = False) -> int:
    """Print per-pool counts and per-trial progress of one grid (or every grid in the workdir)."""
    if grid is None:
        dirs = sorted(p.parent for p in workspace.workdir(workdir).glob("*/trials"))
        if not dirs:
            raise UserError(f"no grids have run in {workspace.workdir(workdir)}; "
                            "start one with `ablate submit GRID_FILE`")
    else:
        dirs = [_resolve_grid_dir(grid, workdir)]
    views = [collect(d, check=True) for d in dirs]
    if as_json:
        json.dump([v.to_json() for v in views] if grid is None else views[0].to_json(), sys.stdout,
                  default=str)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console

    console = Console()
    for v in views:
        console.print(render(v))
        if v.holder is None and any(t.state in ("running", "pending") for t in v.trials):
            console.print("no orchestrator is running this grid: `ablate submit` it again to resume")
        for t in v.trials:
            if t.unreadable:  # the error names the file and its fix
                print(f"warning: trial {t.trial_id}: {t.unreadable}", file=sys.stderr)
            if t.problem:
                print(f"warning: trial {t.trial_id}: {t.problem}; fix: `ablate submit` the grid "
                      "again (it restores the steps from MLflow, or recomputes them from a "
                      "checkpoint)", file=sys.stderr)
    return 0


def cancel(grid: str, *, trials: list[str] | None = None, pool: str | None = None,
           workdir: str | None = None) -> int:
    """Cancel unfinished trials (given ids, one pool, or the whole grid); returns how many.

    Trials nobody runs are marked CANCELLED at once; running ones are asked to stop through
    ``cancel.json`` and stop within a step (their attempt is recorded as cancelled).
    """
    from filelock import Timeout

    grid_dir = _resolve_grid_dir(grid, workdir)
    known = records.known_trials(grid_dir)
    for tid in trials or []:
        if tid not in known:
            raise no_such_trial(tid, known, where=f"grid {grid_dir.name}", see="see `ablate status`")
    if pool is not None and not any(s.pool == pool for s in known.values()):
        pools = sorted({s.pool for s in known.values()})
        hint = did_you_mean(pool, pools)
        raise UserError(f"grid {grid_dir.name}: no trial on pool {pool!r}; pools: {', '.join(pools)}"
                        + (f"; did you mean {hint!r}?" if hint else ""))
    chosen = [t for t, s in known.items() if (trials and t in trials or
              pool is not None and s.pool == pool or not trials and pool is None)]
    targets = [t for t in chosen
               if not records.load_state(TrialPaths(grid_dir, t), t).state.is_finished()]
    requests = list(targets) + (["*"] if not trials and pool is None else [])
    if requests and active_holder(grid_dir) is not None:
        records.add_cancel_requests(grid_dir, requests)
    for tid in targets:
        lock = records.run_lock(TrialPaths(grid_dir, tid))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            records.add_cancel_requests(grid_dir, [tid])  # running: its runner stops it
            continue
        try:
            mark_cancelled(grid_dir, tid)
            # Nobody runs it; a job its killed orchestrator submitted may still (Slurm).
            backends.backend(known[tid].backend).abandon(tid, TrialPaths(grid_dir, tid).root / "logs")
        finally:
            lock.release()
    return len(targets)
