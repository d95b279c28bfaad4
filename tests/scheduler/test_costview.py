"""Cost in ``ablate status`` and the budget's start decisions, from trial files alone (no Ray)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.grid import expand, load_grid
from orchestrator.scheduler import status_command
from orchestrator.scheduler._budget import Admit, Planner
from orchestrator.store import TrialPaths, records
from orchestrator.trial import Attempt, TrialState

GRID = """
name: {name}
recipe: sim/grpo_tiny
steps: 100
seeds: [0, 1]
axes:
  pool: [sim-h100, sim-a100]
budget: {{gpu_hours: {hours}}}
"""


def _grid(tmp: Path, hours: float, name: str = "costs"):
    path = tmp / f"{name}.yaml"
    path.write_text(GRID.format(name=name, hours=hours))
    grid = load_grid(path)
    return grid, expand(grid)


def _ran(grid_dir: Path, trial, seconds: float, *, end: int | None = 100, outcome: str | None = "completed",
         started: float = 1000.0) -> None:
    paths = TrialPaths(grid_dir, trial.trial_id)
    records.save_spec(paths, trial)
    rec = records.TrialRecord(trial.trial_id, state=TrialState.DONE if outcome else TrialState.RUNNING,
                              pool=trial.pool, verdict={"kind": "healthy"} if outcome else None)
    records.save_state(paths, rec)
    records.save_attempts(paths, [Attempt(1, trial.pool, 1, end, outcome, started_at=started,
                                          ended_at=started + seconds if outcome else None,
                                          accelerators=1, unit="cpu_hours")])


def test_status_shows_cost_per_trial_cell_and_grid(isolated: Path, capsys) -> None:
    grid, trials = _grid(isolated, 1.0)
    grid_dir = isolated / ".ablate" / grid.name
    for t in trials:
        _ran(grid_dir, t, 36.0 if t.pool == "sim-h100" else 72.0)  # 0.01 / 0.02 CPU-h
    assert status_command(grid.name, as_json=True) == 0
    view = json.loads(capsys.readouterr().out)
    assert {round(t["cost"]["hours"], 6) for t in view["trials"]} == {0.01, 0.02}
    assert view["cost"]["cpu_hours"]["hours"] == pytest.approx(0.06)
    assert view["cost_by_cell"]["pool=sim-a100"]["cpu_hours"]["hours"] == pytest.approx(0.04)
    assert status_command(grid.name) == 0
    text = capsys.readouterr().out
    assert "cost by cell" in text and "pool=sim-h100" in text and "grid cost: 0.06 CPU-h over 4 trials" in text


def test_budget_starts_waits_or_skips_by_projection(isolated: Path) -> None:
    # One trial projects to 100 steps x 0.1 s (the sim pools' step_seconds) = 10 CPU-s.
    grid, trials = _grid(isolated, 0.005)  # 18 CPU-s
    grid_dir = isolated / "g"
    planner = Planner(grid, grid_dir, trials, grid.pools.pools)
    first, second = trials[:2]
    assert planner.projected(first, first.pool) == pytest.approx(10 / 3600)
    assert planner.admit(first, first.pool, []) is Admit.START
    # With the first running (10 s committed), a second would pass 18 s: it waits.
    assert planner.admit(second, second.pool, [(first.trial_id, first.pool)]) is Admit.WAIT
    assert planner.held[second.trial_id] == "queued: budget: fits once running trials end"
    # The first finished after 12 s (0.12 s a step, measured): 12 + 12 fits no more -> skipped.
    _ran(grid_dir, first, 12.0)
    planner._refresh(force=True)
    assert planner.step_s(second, first.pool) == pytest.approx(0.12)
    assert planner.admit(second, second.pool, []) is Admit.SKIP
    assert "budget.gpu_hours=0.005" in planner.skip_reason(second, second.pool)
    summary = planner.summary()["budget"]
    assert summary["skipped"] == [second.trial_id] and summary["to_finish_hours"] == pytest.approx(12 / 3600)


def test_a_pool_budget_stops_its_pool_only(isolated: Path) -> None:
    path = isolated / "pp.yaml"
    path.write_text(GRID.format(name="pp", hours=1).replace(
        "budget: {gpu_hours: 1}", "budget: {gpu_hours_per_pool: {sim-a100: 0.004}}"))  # 14.4 CPU-s
    grid = load_grid(path)
    trials = expand(grid)
    a100 = [t for t in trials if t.pool == "sim-a100"]
    h100 = [t for t in trials if t.pool == "sim-h100"]
    planner = Planner(grid, isolated / "pp", trials, grid.pools.pools)
    assert planner.admit(a100[0], "sim-a100", []) is Admit.START
    _ran(isolated / "pp", a100[0], 10.0)
    _ran(isolated / "pp", h100[0], 50.0)  # spent on another pool: not counted against sim-a100
    planner._refresh(force=True)
    assert planner.admit(a100[1], "sim-a100", []) is Admit.SKIP  # 10 + 10 s > 14.4 s
    assert "budget.gpu_hours_per_pool.sim-a100=0.004" in planner.skip_reason(a100[1], "sim-a100")
    assert planner.admit(h100[1], "sim-h100", []) is Admit.START  # no budget on sim-h100
