"""Budgets and adaptive seeds end to end on a real local Ray cluster (the deterministic double
of ``tests/doubles.py``: ``correction.is_level: none`` on sim-a100 collapses after step 8, every
other cell stays healthy, so which comparison is decided is known in advance)."""
from __future__ import annotations

from pathlib import Path

import doubles
import pytest
from rayclusters import pool_cluster, write_grid
from trialrecords import trials as read_trials

from orchestrator import scheduler
from orchestrator.cost import trial_cost
from orchestrator.grid import expand, load_grid
from orchestrator.store import TrialPaths, records
from orchestrator.tracking import client

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    with pool_cluster([("sim-h100", 2), ("sim-a100", 2)], extra_paths=[TESTS],
                      env={"ABLATE_DOUBLE_STEP_S": "0.05"}) as (c, _started):
        yield c


@pytest.fixture
def setup(isolated: Path, cluster, monkeypatch: pytest.MonkeyPatch):
    doubles.register(monkeypatch)
    return isolated, cluster


# multiplicity: none: this test is about where seeds go; with Holm over the two comparisons
# 2/2 vs 0/2 (p 0.028) is no longer decided at 2 seeds (tests/test_seeds.py covers that).
ADAPTIVE = """\
compare: {axis: correction.is_level, baseline: token}
multiplicity: none
"""


@pytest.mark.slow
def test_adaptive_seeds_stop_where_decided_and_grow_where_not(setup) -> None:
    tmp, c = setup
    path = write_grid(tmp / "g.yaml", "adapt", steps=40, seeds=[0], levels=["none", "token"],
                      pools=["sim-a100", "sim-h100"], budget="{max_parallel: 4}", extra=ADAPTIVE,
                      tiny=False)
    text = path.read_text().replace(
        "seeds: [0]", "seeds: {adaptive: {min: 2, max: 4, target: collapse_rate, ci_width: 0.3}}")
    path.write_text(text)
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    trials = read_trials(Path(summary["grid_dir"]))
    seeds: dict[tuple, list[int]] = {}
    for t in trials.values():
        seeds.setdefault(tuple(map(tuple, t["spec"]["axes"])), []).append(t["spec"]["seed"])
    by_cell = {dict(k)["correction.is_level"] + "@" + dict(k)["pool"]: sorted(v) for k, v in seeds.items()}
    # sim-a100: 2/2 collapsed vs 0/2 is decided (Newcombe interval above 0) at the first 2 seeds;
    # sim-h100: 0/n vs 0/n never is, so both cells run to max.
    assert by_cell == {"none@sim-a100": [0, 1], "token@sim-a100": [0, 1],
                       "none@sim-h100": [0, 1, 2, 3], "token@sim-h100": [0, 1, 2, 3]}
    # The added seeds are the trials an explicit `seeds: [0, 1, 2, 3]` would run (same ids).
    path.write_text(text.replace("seeds: {adaptive: {min: 2, max: 4, target: collapse_rate, "
                                 "ci_width: 0.3}}", "seeds: [0, 1, 2, 3]"))
    assert set(trials) <= {t.trial_id for t in expand(load_grid(path))}
    a = summary["adaptive"]
    assert (a["decided"], a["comparisons"], len(a["added_seeds"])) == (1, 2, 4)
    [u] = a["undecided"]
    assert u["context"] == "pool=sim-h100" and u["more_seeds"] is None  # no difference seen
    assert summary["states"] == {"done": 12}
    # Every attempt carries its rate; the summary's cost is the sum of the trials' costs.
    costs = [trial_cost(t["attempts"], 40) for t in trials.values()]
    assert all(a.unit == "cpu_hours" and a.accelerators == 1 for t in trials.values() for a in t["attempts"])
    assert summary["cost"]["cpu_hours"]["hours"] == pytest.approx(sum(x.hours for x in costs))
    assert summary["cost"]["cpu_hours"]["trials"] == 12
    collapsed = [x for t, x in zip(trials.values(), costs) if t["state"].verdict["kind"] == "collapsed"]
    assert collapsed and all(x.saved_hours > 0 for x in collapsed)  # early stop saved steps
    # MLflow: cost tags on every trial run, the grid's totals as metrics of the parent run.
    mlc = client(summary["tracking_uri"])
    for t in trials.values():
        tags = mlc.get_run(t["state"].mlflow_run_id).data.tags
        assert tags["cost.unit"] == "cpu_hours" and float(tags["cost.accelerator_hours"]) > 0
    parent = mlc.get_run(summary["parent_run_id"]).data
    assert parent.metrics["cost.cpu_hours"] == pytest.approx(summary["cost"]["cpu_hours"]["hours"])
    assert parent.tags["adaptive.decided"] == "1/2" and parent.tags["adaptive.added_seeds"] == "4"


@pytest.mark.slow
def test_budget_skips_what_does_not_fit_and_a_larger_budget_continues(setup) -> None:
    tmp, c = setup
    path = write_grid(tmp / "g.yaml", "budget", steps=40, seeds=[0, 1, 2, 3, 4, 5], levels=["token"],
                      pools=["sim-h100"], budget="{max_parallel: 1, gpu_hours: 0.0015}", tiny=False)
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    b = summary["budget"]
    grid_dir = Path(summary["grid_dir"])
    done = [t for t in records.trial_ids(grid_dir)
            if records.load_state(TrialPaths(grid_dir, t), t).state.value == "done"]
    assert b["started"] == len(done) >= 1 and len(b["skipped"]) == 6 - len(done) >= 1
    assert b["to_finish_hours"] > 0
    for tid in b["skipped"]:
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        assert rec.state.value == "pending" and "budget.gpu_hours=0.0015" in rec.pending_reason
        assert not records.load_attempts(TrialPaths(grid_dir, tid))  # never started
    spent = summary["cost"]["cpu_hours"]["hours"]
    # Each start fitted its projection (measured step time of the trials before it): the grid
    # may overrun only by one trial's misprojection, never by another whole trial.
    per_trial = spent / len(done)
    assert spent <= 0.0015 + per_trial
    lines = scheduler.end_report(summary)
    assert any("skipped for budget" in line and "submit again" in line for line in lines)
    # A re-submit with a larger budget runs what was skipped, and nothing twice.
    path.write_text(path.read_text().replace("gpu_hours: 0.0015", "gpu_hours: 1"))
    again = scheduler.submit(str(path), address=c.address, progress=False)
    assert again["states"] == {"done": 6} and again["budget"]["skipped"] == []
    assert again["budget"]["started"] == 6 - len(done)


SEARCH = """\
overrides:
  correction.is_bounds: [null, 2.0]
search:
  params:
    correction.is_bounds[1]: {low: 1.5, high: 10.0}
  budget: 6
  objective: {metric: eval/reward/final, mode: max}
"""


@pytest.mark.slow
def test_a_search_stops_at_the_budget_and_a_larger_budget_asks_for_the_rest(setup) -> None:
    tmp, c = setup
    path = write_grid(tmp / "g.yaml", "search-budget", steps=40, seeds=[0], levels=["token"],
                      pools=["sim-h100"], budget="{max_parallel: 1, gpu_hours: 0.0015}",
                      extra=SEARCH, tiny=False)
    summary = scheduler.submit(str(path), address=c.address, progress=False)
    b, grid_dir = summary["budget"], Path(summary["grid_dir"])
    states = {t: records.load_state(TrialPaths(grid_dir, t), t) for t in records.trial_ids(grid_dir)}
    done = [t for t, rec in states.items() if rec.state.value == "done"]
    # The points the budget could pay for ran; the search stopped at the first it could not.
    assert 1 <= len(done) < 6 and b["search_points_not_started"] == 6 - len(done), (b, states)
    assert b["to_finish_hours"] > 0
    for tid, rec in states.items():  # a point recorded but held back stays pending, with why
        if tid not in done:
            assert rec.state.value == "pending" and "budget.gpu_hours=0.0015" in rec.pending_reason
            assert not records.load_attempts(TrialPaths(grid_dir, tid))
    spent = summary["cost"]["cpu_hours"]["hours"]
    assert spent <= 0.0015 + spent / len(done)  # overrun by at most one misprojection
    assert any(f"{6 - len(done)} search point(s) not started" in line and "submit again" in line
               for line in scheduler.end_report(summary))
    # A larger budget continues the search to its 6 points, running nothing twice.
    path.write_text(path.read_text().replace("gpu_hours: 0.0015", "gpu_hours: 1"))
    again = scheduler.submit(str(path), address=c.address, progress=False)
    assert again["states"] == {"done": 6}, again["states"]
    assert again["budget"]["search_points_not_started"] == 0
    assert again["budget"]["started"] == 6 - len(done)


@pytest.mark.parametrize("limit", [
    "exclude:\n  - {correction.is_level: token, seed: [1, 2]}\n",   # the cell keeps seeds 0 and 3
    "exclude:\n  - {correction.is_level: token}\ninclude:\n  - {correction.is_level: token, pool: sim-h100, seed: 7}\n",
], ids=["exclude-seeds", "include-seed"])
def test_adaptive_seeds_stop_at_the_seeds_a_cell_has(isolated: Path, limit: str) -> None:
    """A cell that `exclude:`/`include:` left with fewer than `max` seeds is at its max once
    they ran: no next seed for it (was an IndexError in `Planner.next_seed` after the first
    trial), and `ablate plan` counts what really starts."""
    from orchestrator.grid import plan_lines
    from orchestrator.scheduler._budget import Planner
    from orchestrator.trial import Attempt, TrialState

    path = isolated / "g.yaml"
    path.write_text("name: few\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 4\n"
                    "seeds: {adaptive: {min: 2, max: 4, target: final_reward, ci_width: 0.001}}\n"
                    "axes:\n  correction.is_level: [none, token]\n  pool: [sim-h100]\n" + limit)
    grid = load_grid(path)
    trials = expand(grid)
    token = sorted(t.seed for t in trials if dict(t.axes)["correction.is_level"] == "token")
    start = 2 + min(2, len(token))
    assert any(f"starts with {start} trials" in line for line in plan_lines(grid, trials))
    grid_dir = isolated / ".ablate" / "few"
    planner = Planner(grid, grid_dir, trials, grid.pools.pools)
    first = planner.initial(trials)
    for i, t in enumerate(first):  # every started trial finished, rewards far apart
        paths = TrialPaths(grid_dir, t.trial_id)
        records.save_spec(paths, t)
        records.save_attempts(paths, [Attempt(1, t.pool, 1, 4, "completed", started_at=0.0,
                                              ended_at=1.0)])
        records.save_state(paths, records.TrialRecord(
            trial_id=t.trial_id, state=TrialState.DONE, last_step=4, verdict={"kind": "healthy"}))
        records.atomic_write_json(paths.result, {"summary": {"critic/score/mean": float(i % 2)}})
    added = []
    while (nxt := planner.next_seed(added)) is not None:
        added.append(nxt)
        assert len(added) < 10
    assert {dict(t.axes)["correction.is_level"] for t in added} <= {"none"}
    assert not any(c["seeds"] > len(token) for c in planner.summary()["adaptive"]["cells"]
                   if "token" in c["cell"])


def test_the_budget_counts_the_grids_probe_hours(isolated: Path, capsys) -> None:
    """Hours the grid's probes spent (``ablate probe``, ``preflight:``: its probe ledger) are
    spent from its budget like a trial's: a trial that fits beside the trials' own hours is
    skipped once the probes' are added, the end report says what the probes took, and a
    damaged ledger is one warning and counts none."""
    from orchestrator.cost import pool_rate
    from orchestrator.scheduler._budget import Admit, Planner, end_report
    from orchestrator.store import probe_ledger
    from orchestrator.trial import Attempt, TrialState

    path = isolated / "g.yaml"
    path.write_text("name: probed\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 4\nseeds: [0, 1]\n"
                    "budget: {gpu_hours: 0.25}\npool: sim-h100\n")
    grid = load_grid(path)
    first, second = expand(grid)
    grid_dir = isolated / ".ablate" / "probed"
    n, unit = pool_rate(grid.pools.get("sim-h100"))
    paths = TrialPaths(grid_dir, first.trial_id)  # 4 steps in 360/n s: 0.1 h of the budget
    records.save_spec(paths, first)
    records.save_attempts(paths, [Attempt(1, first.pool, 1, 4, "completed", started_at=0.0,
                                          ended_at=360.0 / n)])
    records.save_state(paths, records.TrialRecord(
        trial_id=first.trial_id, state=TrialState.DONE, last_step=4, verdict={"kind": "healthy"}))

    def admit() -> tuple[Admit, Planner]:
        planner = Planner(grid, grid_dir, [first, second], grid.pools.pools)
        return planner.admit(second, "sim-h100", []), planner

    assert admit()[0] is Admit.START  # 0.1 h spent + 0.1 h projected <= 0.25 h
    probe_ledger.write(grid_dir, {"p1": {"label": "sim-h100", "pool": "sim-h100", "unit": unit,
                                         "hours": 0.1, "runs": 1}})
    verdict, planner = admit()
    assert verdict is Admit.SKIP and planner.spent() == pytest.approx(0.2)
    assert "0.2" in planner.skip_reason(second, "sim-h100")
    budget = planner.summary()["budget"]
    assert budget["spent"] == {unit: pytest.approx(0.2)} and budget["probes"] == {unit: 0.1}
    assert any("the grid's probes" in line for line in end_report({"budget": budget}))
    (grid_dir / probe_ledger.LEDGER).write_text("[1, 2]")
    assert admit()[0] is Admit.START
    warned = [ln for ln in capsys.readouterr().err.splitlines() if probe_ledger.LEDGER in ln]
    assert len(warned) == 1 and "counts no probe hours" in warned[0]
