"""The cost keys of a grid: adaptive seeds expand to the trials listed seeds would give, the plan
says what an adaptive grid starts with and what every trial would cost."""
from __future__ import annotations

from pathlib import Path

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid

GRID = """
name: g
recipe: sim/grpo_tiny
steps: 100
seeds: {seeds}
axes:
  correction.is_level: [none, token]
  pool: [sim-h100, sim-a100]
compare: [{{axis: correction.is_level, baseline: none}}, {{axis: pool, baseline: sim-h100}}]
budget: {{gpu_hours: 2, gpu_hours_per_pool: {{sim-a100: 1}}}}
"""


def _write(tmp: Path, seeds: str) -> Path:
    path = tmp / f"g{len(seeds)}.yaml"
    path.write_text(GRID.format(seeds=seeds))
    return path


def test_adaptive_seeds_are_the_listed_seeds_trials(isolated: Path) -> None:
    adaptive = load_grid(_write(isolated, "{adaptive: {min: 2, max: 5, target: collapse_rate}}"))
    listed = load_grid(_write(isolated, "[0, 1, 2, 3, 4]"))
    assert [t.trial_id for t in expand(adaptive)] == [t.trial_id for t in expand(listed)]
    assert [c.axis for c in adaptive.spec.comparisons] == ["correction.is_level", "pool"]
    assert adaptive.spec.adaptive.seeds == [0, 1, 2, 3, 4] and listed.spec.adaptive is None


def test_plan_shows_adaptive_start_projected_cost_and_budget(isolated: Path, capsys) -> None:
    path = _write(isolated, "{adaptive: {min: 3, max: 6, target: final_reward, ci_width: 0.1}}")
    assert main(["plan", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "adaptive seeds: starts with 12 trials (3 per cell), at most 24 (6 per cell)" in out
    # 24 trials x 100 steps x 0.1 s (the sim pools' step_seconds) on one CPU = 240 CPU-s.
    assert "projected cost of every trial (pools' step_seconds): 0.0667 CPU-h" in out
    assert "budget: gpu_hours=2 per pool sim-a100=1" in out
    assert not (isolated / ".ablate").exists()


def test_one_budget_over_cpu_and_gpu_pools_is_refused(isolated: Path) -> None:
    """A verl grid on a cpu and a gpu pool: CPU-hours and GPU-hours do not add up, so one
    `budget.gpu_hours` over both is refused (per-pool budgets are fine)."""
    import pytest

    from orchestrator.exceptions import GridError

    text = ("name: mixed\nrecipe: verl/cpu_tiny\nbackend: verl\nsteps: 3\nseeds: [0]\n"
            "axes:\n  pool: [cpu-fp32, h100]\nbudget:\n  {budget}\n")
    path = isolated / "mixed.yaml"
    path.write_text(text.format(budget="gpu_hours: 100"))
    with pytest.raises(GridError, match=r"budget.gpu_hours: one budget over pools counted in "
                       r"different units \(cpu-fp32: cpu_hours, h100: gpu_hours\).*fix: set "
                       r"budget.gpu_hours_per_pool"):
        load_grid(path)
    path.write_text(text.format(budget="gpu_hours_per_pool: {cpu-fp32: 10, h100: 100}"))
    assert len(expand(load_grid(path))) == 2
