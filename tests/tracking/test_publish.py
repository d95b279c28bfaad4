"""``ablate publish``: a grid's recorded trials copied into another MLflow store (a second
SQLite store here), every step once, params, tags and verdicts as a submission logs them;
publishing twice writes nothing twice; a trial resumed since replaces its published run; the
other store's ``ablate compare`` then finds them, and one that finds nothing says where they are
(``tracking/_publish.py``). Trials are real 8-step simulator runs (``ablate run-trial``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.scheduler._identity import store_note
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.tracking import client, publish

GRID = """\
name: pub
recipe: sim/grpo_tiny
backend: sim
steps: 8
seeds: [0]
pool: sim-h20
axes:
  "correction (IS)":
    none: {correction.is_level: none}
    tis: {correction.is_level: token}
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  eval.every: 4
checkpoint: {every: 4}
"""


def _runs(uri: str) -> list:
    mlc = client(uri)
    exp = mlc.get_experiment_by_name("pub")
    if exp is None:
        return []
    return mlc.search_runs([exp.experiment_id], filter_string="tags.trial_id != ''")


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(uri).get_metric_history(run_id, key))


@pytest.mark.slow
def test_publish_copies_each_step_once_and_twice_writes_nothing(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = isolated / "pub.yaml"
    path.write_text(GRID)
    grid = load_grid(path)
    trials = expand(grid)
    for t in trials:
        run_single(str(path), t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    other = f"sqlite:///{isolated / 'team' / 'mlflow.db'}"
    (isolated / "team").mkdir()

    # A submission against the other store would run nothing and show nothing there: it says so.
    from orchestrator.scheduler._identity import check_identity

    check_identity(grid, grid_dir, trials)
    note = store_note(grid, grid_dir, trials, other)
    assert note is not None and "2 finished trial(s) are not run again and have no run in" in note
    assert f"`ablate publish {path} --tracking-uri {other}`" in note
    # Compare there finds nothing and says where the results are, and the command.
    capsys.readouterr()
    assert main(["compare", str(path), "--tracking-uri", other]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds 2 finished trial(s) of it" in err, err
    # A message names a store by its absolute path: a relative one would depend on the folder
    # the reader runs the next command in.
    assert f"`ablate publish {path} --tracking-uri {other}`" in err
    assert json.loads((grid_dir / "identity.json").read_text())["stores"] == [other]

    report = publish(grid, tracking_uri=other)
    assert sorted(report.published) == sorted(t.trial_id for t in trials)
    runs = {r.data.tags["trial_id"]: r for r in _runs(other)}
    assert len(runs) == 2
    for t in trials:
        run = runs[t.trial_id]
        rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
        assert run.info.status == "FINISHED"
        assert run.data.tags["verdict"] == rec.verdict["kind"]
        assert run.data.params["correction _IS_"] == t.axis_values["correction (IS)"]
        assert json.loads(run.data.tags["ablate.axes"]) == [list(a) for a in t.axes]
        assert run.data.tags["ablate.config"] == t.config
        rows = list(records.iter_metrics(TrialPaths(grid_dir, t.trial_id).metrics))
        for key in ("critic/score/mean", "rollout_corr/k3_kl", "eval/reward"):
            want = [(s, m[key]) for s, m in rows if key in m]
            assert _history(other, run.info.run_id, key) == want, key
        assert [s for s, _ in _history(other, run.info.run_id, "critic/score/mean")] == list(range(1, 9))

    # Twice: nothing written (no new run, no new metric point, no new parent run).
    def snapshot() -> dict:
        mlc = client(other)
        exp = mlc.get_experiment_by_name("pub")
        every = mlc.search_runs([exp.experiment_id], run_view_type=3)
        return {r.info.run_id: (r.info.lifecycle_stage, dict(r.data.tags),
                                _history(other, r.info.run_id, "critic/score/mean")) for r in every}

    before = snapshot()
    again = publish(grid, tracking_uri=other)
    assert again.published == [] and again.replaced == [] and len(again.unchanged) == 2
    assert snapshot() == before
    assert store_note(grid, grid_dir, trials, other) is None
    capsys.readouterr()
    assert main(["publish", str(path), "--tracking-uri", other]) == 0
    assert capsys.readouterr().out.startswith("published 0 trials of grid pub to ")
    assert snapshot() == before
    # An unreachable store: one line, exit 2, nothing written anywhere.
    assert main(["publish", str(path), "--tracking-uri", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    # (the store is probed before anything is read or written: the environment check says so)
    assert len(err.splitlines()) == 1 and "no MLflow server answers" in err, err
    assert snapshot() == before

    # The other store's compare now sees both cells.
    out = isolated / "res"
    assert main(["compare", str(path), "--tracking-uri", other, "--out", str(out)]) == 0
    assert "tis" in (out / "cells.csv").read_text() and "none" in (out / "cells.csv").read_text()

    # A trial continued since (resumed from step 4): its published run is replaced, once.
    t = trials[0]
    from orchestrator.scheduler import resume

    resume(str(path), trial_ids=[t.trial_id], pool="sim-h20", start=4, local=True)
    third = publish(grid, tracking_uri=other)
    assert third.replaced == [t.trial_id] and len(third.unchanged) == 1
    active = [r for r in _runs(other) if r.data.tags["trial_id"] == t.trial_id]
    assert len(active) == 1
    assert [s for s, _ in _history(other, active[0].info.run_id, "critic/score/mean")] == list(range(1, 9))
    assert "published 0 trials" in publish(grid, tracking_uri=other).describe("pub")
