"""A grid's MLflow runs written by a test, without running it: the parent run in a SQLite store
under ``<root>/.ablate``, and each trial's run fed a metrics stream through the verdict engine,
as the runner would have logged it."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import verdict_streams as V

from orchestrator.grid import GridSpec, expand, load_grid
from orchestrator.tracking import GridRun, TrialRun
from orchestrator.trial import Attempt, TrialSpec
from orchestrator.verdict import VerdictEngine


@contextlib.contextmanager
def isolated_module(root: Path) -> Iterator[pytest.MonkeyPatch]:
    """cwd and environment like the ``isolated`` fixture, for a module-scoped store under ``root``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("ABLATE_WORKDIR", str(root / ".ablate"))
        mp.setenv("ABLATE_RECIPES", str(Path(__file__).resolve().parents[2] / "recipes"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield mp


def open_grid(root: Path, name: str, text: str) -> tuple[Path, GridSpec, str, GridRun]:
    """Write grid ``text`` to ``root/name`` and open its parent run: (file, grid, uri, run)."""
    gfile = root / name
    gfile.write_text(text)
    grid = load_grid(gfile)
    uri = f"sqlite:///{root / '.ablate' / 'mlflow.db'}"
    (root / ".ablate").mkdir(exist_ok=True)
    return gfile, grid, uri, GridRun.open(grid, tracking_uri=uri, workdir=root / ".ablate")


def track(uri: str, parent: GridRun, grid: GridSpec, trial: TrialSpec, buf: Path,
          stream: V.Stream, attempts: Callable[[int, bool], list[Attempt]], *,
          verdict: bool = True) -> TrialRun:
    """Log ``stream`` up to the step where the verdict engine stops it (or to its end), the
    ``attempts(last_step, stopped)``, and the verdict unless ``verdict`` is False; end the run."""
    tr = TrialRun(uri, parent.experiment_id, parent.run_id, trial, grid.pools.get(trial.pool),
                  run_id=None, buffer_dir=buf / trial.trial_id)
    engine = VerdictEngine(grid.spec.collapse, grid.spec.early_stop_spec, trial.steps)
    last, stop = 0, None
    for step, row in stream:
        last, stop = step, engine.observe(step, row)
        if stop:
            break
    tr.log([r for r in stream if r[0] <= last])
    tr.log_attempts(attempts(last, bool(stop)))
    if verdict:
        tr.set_verdict(engine.verdict(last, "stopped" if stop else "completed", stop))
    assert tr.end("FINISHED")
    return tr


# 8 trials of 40 steps: 2 corrections x 2 pools x 2 seeds.
EIGHT_TRIALS = """
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: 40
seeds: [0, 1]
axes:
  correction.is_level: [none, sequence]
  pool: [sim-h100, sim-a100]
"""


def record_grid(root: Path, file: str, name: str) -> tuple[Path, str]:
    """``EIGHT_TRIALS`` as grid ``name`` (file ``root/file``) with every trial tracked: each
    fourth trial collapses slowly from step 20 of 40, the rest stay healthy. Returns (file,
    tracking URI)."""
    gfile, grid, uri, parent = open_grid(root, file, EIGHT_TRIALS.format(name=name))
    for i, t in enumerate(expand(grid)):
        stream = V.slow_collapse(n=40, seed=i, start=20) if i % 4 == 0 else V.healthy(n=40, seed=i)
        track(uri, parent, grid, t, root / "buf", stream, lambda last, stopped: [])
    parent.end()
    return gfile, uri
