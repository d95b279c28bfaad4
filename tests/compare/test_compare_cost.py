"""``ablate compare``: the cost table and the declared comparisons with their intervals, on real
MLflow runs (SQLite) whose attempts carry wall times and accelerator counts."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import trackedruns
import verdict_streams as V

from orchestrator.compare import compare
from orchestrator.grid import expand
from orchestrator.store import atomic_write_json
from orchestrator.tracking import GridRun
from orchestrator.trial import Attempt

GRID = """
name: cost-test
recipe: sim/grpo_tiny
backend: sim
steps: 120
seeds: [0, 1, 2]
pool: sim-a100
axes:
  correction.is_level: [none, sequence]
  train.lr: [5.0e-4, 1.0e-3]
compare: {axis: correction.is_level, baseline: none}
"""


def _track(uri: str, parent: GridRun, grid, trial, buf: Path) -> None:
    """is_level none collapses (explosion at step 80, stopped early), sequence stays healthy;
    each attempt took 36 s per 10 steps on one CPU (0.01 CPU-h per 10 steps)."""
    none = trial.axis_values["correction.is_level"] == "none"
    stream = (V.explosion(n=120, seed=trial.seed, onset=80, eval_every=10) if none
              else V.healthy(n=120, seed=trial.seed, eval_every=10))

    def ran(last: int, stopped: bool) -> list[Attempt]:
        return [Attempt(1, trial.pool, 1, last, "stopped_early" if stopped else "completed",
                        started_at=1000.0, ended_at=1000.0 + 3.6 * last, accelerators=1,
                        unit="cpu_hours")]

    trackedruns.track(uri, parent, grid, trial, buf, stream, ran)


def test_compare_writes_cost_table_and_decides_declared_comparisons(isolated: Path, capsys) -> None:
    gfile, grid, uri, parent = trackedruns.open_grid(isolated, "cost.yaml", GRID)
    for t in expand(grid):
        _track(uri, parent, grid, t, isolated / "buf")
    parent.end()
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    rows = list(csv.DictReader((out / "cost.csv").read_text().splitlines()))
    trials = [r for r in rows if r["level"] == "trial"]
    assert len(trials) == 12 and {r["unit"] for r in rows} == {"cpu_hours"}
    healthy = [r for r in trials if "sequence" in r["cell"]]
    assert all(float(r["accelerator_hours"]) == pytest.approx(0.12) for r in healthy)  # 120 steps
    collapsed = [r for r in trials if "none" in r["cell"]]
    assert all(float(r["early_stop_saved_hours"]) > 0 for r in collapsed)
    [total] = [r for r in rows if r["level"] == "grid"]
    assert int(total["trials"]) == 12
    assert float(total["accelerator_hours"]) == pytest.approx(sum(float(r["accelerator_hours"]) for r in trials), rel=1e-4)
    cells = [r for r in rows if r["level"] == "cell"]
    assert len(cells) == 4 and all(int(r["trials"]) == 3 for r in cells)
    comps = list(csv.DictReader((out / "comparisons.csv").read_text().splitlines()))
    rate = [c for c in comps if c["target"] == "collapse_rate"]
    # 0/3 collapsed vs 3/3: difference -1, Newcombe interval [-1, -0.206]: decided, per lr.
    assert len(rate) == 2 and all(c["decided"] == "True" for c in rate)
    assert {float(c["difference"]) for c in rate} == {-1.0}
    assert all(float(c["high"]) == pytest.approx(-0.2063, abs=1e-3) for c in rate)
    md = (out / "summary.md").read_text()
    assert "## Cost" in md and "## Declared comparisons" in md and "Undecided:" in md
    assert "Newcombe" in md and "| **grid** | 12 |" in md
    assert "Declared comparisons" in (out / "summary.html").read_text()
    printed = capsys.readouterr().out
    assert "cost: " in printed and "collapse_rate: correction.is_level=sequence vs none" in printed


def test_the_grids_probes_are_cost_rows_of_their_own(isolated: Path, capsys) -> None:
    """What ``ablate probe`` or a submit's ``preflight:`` spent (the grid's probe ledger) is in
    cost.csv as ``probe`` rows and in summary.md, not in the trials' grid total; a damaged
    ledger is left out with one warning."""
    gfile, grid, uri, parent = trackedruns.open_grid(isolated, "cost.yaml", GRID)
    for t in expand(grid):
        _track(uri, parent, grid, t, isolated / "buf")
    parent.end()
    ledger = isolated / ".ablate" / "cost-test" / "probes.json"
    atomic_write_json(ledger, {"probes": {
        "p000000000001": {"label": "pool=sim-a100", "pool": "sim-a100", "unit": "cpu_hours",
                          "hours": 0.004, "runs": 1},
        "p000000000002": {"label": "pool=sim-a100 correction.is_level=none", "pool": "sim-a100",
                          "unit": "cpu_hours", "hours": 0.002, "runs": 1}}})
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    rows = list(csv.DictReader((out / "cost.csv").read_text().splitlines()))
    probes = [r for r in rows if r["level"] == "probe"]
    assert [(r["trial_id"], float(r["accelerator_hours"])) for r in probes] == [
        ("p000000000001", 0.004), ("p000000000002", 0.002)]
    [total] = [r for r in rows if r["level"] == "grid"]
    trials = [r for r in rows if r["level"] == "trial"]
    assert float(total["accelerator_hours"]) == pytest.approx(
        sum(float(r["accelerator_hours"]) for r in trials), rel=1e-4)
    assert "Probes: 2 configurations probed, 0.006 CPU-h" in (out / "summary.md").read_text()
    assert "Probes: 2 configurations probed, 0.006 CPU-h" in (out / "summary.html").read_text()
    assert "Probes: 2 configurations probed" in capsys.readouterr().out
    ledger.write_text('{"probes": {"p1": {"hours": "lots"}}}')
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    rows = list(csv.DictReader((out / "cost.csv").read_text().splitlines()))
    assert not [r for r in rows if r["level"] == "probe"]
    warned = [line for line in capsys.readouterr().err.splitlines() if "probes.json" in line]
    assert len(warned) == 1 and "cost.csv leaves the probes out" in warned[0]


def test_compare_time_to_collapse_multiplicity_and_equivalence(isolated: Path) -> None:
    """Early-stopped collapses are events at their onset step, healthy trials censored at 120;
    comparisons.csv carries p-values adjusted over the family and the TOST verdict."""
    text = GRID.replace("compare: {axis: correction.is_level, baseline: none}",
                        "compare: [{axis: correction.is_level, baseline: none},\n"
                        "          {axis: correction.is_level, baseline: none, target: final_reward,"
                        " margin: 0.9, paired: true}]")
    gfile, grid, uri, parent = trackedruns.open_grid(isolated, "surv.yaml", text.replace("cost-test", "surv-test"))
    for t in expand(grid):
        _track(uri, parent, grid, t, isolated / "buf")
    parent.end()
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    surv = {r["cell"]: r for r in csv.DictReader((out / "survival.csv").read_text().splitlines())}
    assert len(surv) == 4 and (out / "survival.png").stat().st_size > 0
    for cell, r in surv.items():
        assert int(r["n"]) == 3 and r["horizon"] == "120"
        if "none" in cell:  # stopped early after its collapse: events at the onset, not censored
            assert (r["events"], r["censored"]) == ("3", "0")
            assert 60 <= float(r["km_median_step"]) <= 100 and float(r["rmst"]) < 110
        else:
            assert (r["events"], r["censored"]) == ("0", "3")
            assert r["km_median_step"] == "inf" and float(r["rmst"]) == 120.0
    comps = list(csv.DictReader((out / "comparisons.csv").read_text().splitlines()))
    ttc = [c for c in comps if c["target"] == "time_to_collapse"]
    assert len(ttc) == 2 and all(float(c["difference"]) > 10 for c in ttc)
    for c in comps:
        assert c["multiplicity"] == "holm" and float(c["p_adjusted"]) >= float(c["p_value"]) - 1e-12
        assert (c["decided"] == "True") == (float(c["p_adjusted"]) < 0.05)
    fr = [c for c in comps if c["target"] == "final_reward"]
    assert {c["paired"] for c in fr} >= {"True"} and {c["equivalence"] for c in fr if c["margin"]} <= {
        "equivalent", "not_equivalent", "inconclusive"}
    md = (out / "summary.md").read_text()
    assert "## Time to collapse" in md and "| p (adjusted) |" in md and "survival" in md
    assert "Time to collapse" in (out / "summary.html").read_text()
    # The grid's MLflow parent run carries the section (its note) and the files (artifacts).
    from orchestrator.tracking import client

    mlc = client(uri)
    arts = {a.path for a in mlc.list_artifacts(parent.run_id, "results")}
    assert {"results/survival.csv", "results/survival.png", "results/comparisons.csv"} <= arts
    assert "## Time to collapse" in mlc.get_run(parent.run_id).data.tags["mlflow.note.content"]
