"""A grid's ``preflight:``: ``ablate submit`` probes each configuration before any trial starts
and refuses the grid (exit 1, one line per configuration beyond the gate, nothing trained), or
with ``on_fail: skip`` leaves that configuration's trials not started with the reason in their
records; a bad gate is one line at plan, exit 2.

The grid: the quickstart's recipe on its two simulator pools, 2 steps, one seed. Its probe is
the committed quickstart's (sim-h100 k3 ~8.7e-07, sim-a100 ~6.8e-05): a bound of 1e-05 passes
the one and fails the other. The refusal test runs only the probe (~5 s); the skip test runs
the sim-h100 trial through Ray (~30 s on 2 cores).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.store import TrialPaths, records

A100_K3 = "6.86e-05"  # the probe's k3 on sim-a100 (seed 0, 4 batches), as printed
GRID = """\
name: preflight-check
recipe: sim/grpo_tiny
backend: sim
steps: 2
seeds: [0]
axes:
  pool: [sim-h100, sim-a100]
budget: {{max_parallel: 1}}
checkpoint: {{every: 1, keep: 1}}
preflight:
{preflight}
"""


def _grid(tmp_path: Path, preflight: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(GRID.format(preflight=preflight))
    return path


def _trials(path: Path) -> dict[str, str]:
    return {t.pool: t.trial_id for t in expand(load_grid(str(path)))}


def test_a_configuration_beyond_the_gate_refuses_the_grid_and_nothing_trains(tmp_path,
                                                                             capsys) -> None:
    grid = _grid(tmp_path, "  gate: {k3: 1.0e-5}")
    wd = tmp_path / "wd"
    assert main(["plan", str(grid)]) == 0
    assert ("preflight: `ablate submit` probes each configuration first (ablate probe) and "
            "refuses the grid beyond k3<=1e-05") in capsys.readouterr().out
    assert main(["submit", str(grid), "--workdir", str(wd), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    gate_lines = [line for line in err if "GATE FAILED" in line]
    assert gate_lines == [f"preflight: GATE FAILED pool=sim-a100: k3 = {A100_K3}, bound k3<=1e-05"]
    assert err[-1].startswith("error: preflight refused grid preflight-check: 1 of 2 "
                              "configurations beyond the gate, no trial started"), err
    grid_dir = wd / "preflight-check"
    assert not [t for t in _trials(grid).values() if TrialPaths(grid_dir, t).state.exists()]
    refused = json.loads((grid_dir / "preflight.json").read_text())["refused"]
    assert refused[-1] == err[-1]
    assert (grid_dir / "preflight" / "probe.md").is_file()


def test_on_fail_skip_runs_the_rest_and_records_why_the_others_did_not_start(tmp_path,
                                                                            capsys) -> None:
    grid = _grid(tmp_path, "  gate: {k3: 1.0e-5}\n  on_fail: skip")
    wd = tmp_path / "wd"
    ids = _trials(grid)
    assert main(["submit", str(grid), "--workdir", str(wd), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "preflight: GATE FAILED pool=sim-a100" in err
    grid_dir = wd / "preflight-check"
    ran = records.load_state(TrialPaths(grid_dir, ids["sim-h100"]), ids["sim-h100"])
    assert ran.state.is_finished() and ran.last_step == 2
    held = records.load_state(TrialPaths(grid_dir, ids["sim-a100"]), ids["sim-a100"])
    assert not held.state.is_finished() and held.last_step in (None, 0)
    assert held.pending_reason.startswith(f"not started: preflight: k3 {A100_K3} beyond the gate "
                                          "k3<=1e-05 (probe p"), held.pending_reason
    record = json.loads((grid_dir / "preflight.json").read_text())
    assert record["skipped"] == {ids["sim-a100"]: held.pending_reason.removeprefix("not started: ")}
    assert record["run_id"]  # the probe's MLflow run, in the grid's store
    assert main(["status", str(grid), "--workdir", str(wd), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert f"preflight: k3 {A100_K3}" in json.dumps(shown), shown
    # A second submit probes nothing new (the cache) and still holds the configuration back.
    assert main(["submit", str(grid), "--workdir", str(wd), "--quiet"]) == 0
    assert "(cached)" in capsys.readouterr().err
    held = records.load_state(TrialPaths(grid_dir, ids["sim-a100"]), ids["sim-a100"])
    assert held.pending_reason.startswith("not started: preflight:")


@pytest.mark.parametrize("preflight, says", [
    ("  gate: {k9: 0.1}", "preflight.gate.k9: unknown metric 'k9'; allowed: k3, k1"),
    ("  gate: {k3: abc}", "preflight.gate.k3: the bound 'abc' is not a finite number"),
    ("  gate: {k3: '>=.nan'}", "preflight.gate.k3: the bound '.nan' is not a finite number"),
    ("  gate: {}", "preflight.gate"),
    ("  on_fail: retry\n  gate: {k3: 0.1}", "preflight.on_fail"),
])
def test_a_bad_preflight_is_one_line_at_plan_and_submit_exit_2(tmp_path, capsys, preflight,
                                                               says) -> None:
    grid = _grid(tmp_path, preflight)
    wd = tmp_path / "wd"
    for command in (["plan", str(grid)], ["submit", str(grid), "--workdir", str(wd)]):
        code = main(command)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and says in err[0] and "grid.yaml:" in err[0], err
    assert not (wd / "preflight-check").exists() and not (wd / "probes").exists()
