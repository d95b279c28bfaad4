"""``ablate compare`` forms one cell per configuration, on real MLflow runs (SQLite): axis names
MLflow sanitises are read back under their own names (``none`` and ``token-tis`` stay two cells),
an ``include:`` point is a cell of its own (not a second seed of the axis' cell), and runs logged
without the ``ablate.axes`` tag are read by their sanitised param keys."""
from __future__ import annotations

import csv
from pathlib import Path

import trackedruns
import verdict_streams as V

from orchestrator.compare import compare
from orchestrator.compare._data import load_results
from orchestrator.grid import expand
from orchestrator.tracking import AXES_TAG, client
from orchestrator.trial import Attempt

GRID = """
name: cells
recipe: sim/grpo_tiny
backend: sim
steps: 40
seeds: [0]
pool: sim-h100
axes:
  "correction (IS)":
    none: {correction.is_level: none}
    token-tis: {correction.is_level: token}
  correction.is_mode: [truncate, mask]
exclude:
  - {"correction (IS)": none, correction.is_mode: mask}
include:
  - {"correction (IS)": token-tis, correction.is_mode: mask, correction.is_bounds: [0.9, 1.1]}
"""


def _ran(pool: str):
    def attempts(last: int, stopped: bool) -> list[Attempt]:
        return [Attempt(1, pool, 1, last, "stopped_early" if stopped else "completed")]
    return attempts


def test_cells_are_configurations(isolated: Path) -> None:
    gfile, grid, uri, parent = trackedruns.open_grid(isolated, "cells.yaml", GRID)
    trials = expand(grid)
    assert len(trials) == 4  # none/truncate, token-tis/truncate, token-tis/mask, the include
    for i, t in enumerate(trials):
        trackedruns.track(uri, parent, grid, t, isolated / "buf",
                          V.healthy(n=40, seed=i, eval_every=10), _ran(t.pool))
    parent.end()
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    cells = list(csv.DictReader((out / "cells.csv").read_text().splitlines()))
    keys = sorted((c["correction (IS)"], c["correction.is_mode"], c.get("variant", ""), c["trials"])
                  for c in cells)
    by_id = {t.trial_id: t for t in trials}
    assert len(keys) == 4, keys  # four configurations, four cells of one trial each
    assert all(len(k[3].split()) == 1 for k in keys)
    labels = {(k[0], k[1], k[2]) for k in keys}
    assert labels == {("none", "truncate", ""), ("token-tis", "truncate", ""),
                      ("token-tis", "mask", ""),
                      ("token-tis", "mask", "correction.is_bounds=[0.9,1.1]")}
    inc = next(k[3] for k in keys if k[2])
    assert dict(by_id[inc].overrides)["correction.is_bounds"] == (0.9, 1.1)

    # A run logged before the axes tag, read without its workdir: the sanitised param key.
    mlc = client(uri)
    exp = mlc.get_experiment_by_name(grid.name)
    for r in mlc.search_runs([exp.experiment_id], filter_string="tags.trial_id != ''"):
        mlc.delete_tag(r.info.run_id, AXES_TAG)
    got = load_results(mlc, exp.experiment_id, [a.name for a in grid.axes], grid_dir=None)
    assert sorted(r.axes["correction (IS)"] for r in got) == ["none", "token-tis", "token-tis",
                                                             "token-tis"]


def test_one_label_two_configurations_are_two_cells() -> None:
    """A grid extended (``--extend``) after its pool's definition changed: the same labels,
    other trial configs; they must not be pooled as seeds of one cell."""
    from orchestrator.compare._data import TrialResult, split_configs

    def result(tid: str, config: str) -> TrialResult:
        return TrialResult(tid, "r", {"a": "x"}, 0, "p", "FINISHED", "healthy", None, "", None,
                           {}, {}, [], config=config)

    rs = [result("t1", "c1"), result("t2", "c1"), result("t3", "c2")]
    split_configs(rs, ["a"])
    assert [r.variant for r in rs] == ["config c1", "config c1", "config c2"]
    same = [result("t1", "c1"), result("t2", "c1")]
    split_configs(same, ["a"])
    assert [r.variant for r in same] == ["", ""]


def test_a_finished_trial_not_yet_in_mlflow_is_counted_not_dropped() -> None:
    """Three trials on disk: one done and in MLflow, one done a moment ago whose run the outbox
    has not sent, one running. The partial comparison counts all three."""
    from orchestrator.compare._data import TrialResult, split_unfinished
    from orchestrator.trial import TrialState

    sent = TrialResult(trial_id="ta", run_id="r", axes={}, seed=0, pool="sim-h100",
                       status="FINISHED", verdict="healthy", verdict_step=10, verdict_reason="",
                       derived_from=None, curves={}, latest={}, segments=[])
    states = {"ta": TrialState.DONE, "tb": TrialState.DONE, "tc": TrialState.RUNNING}
    done, unfinished = split_unfinished([sent], None, states=states)
    assert [r.trial_id for r in done] == ["ta"]
    assert (unfinished.running, unfinished.queued, unfinished.unsent) == (1, 0, 1)
    assert unfinished and len(done) + unfinished.running + unfinished.unsent == 3
    assert unfinished.describe().startswith(
        "2 trials unfinished (1 running, 0 queued, 1 finished but not in MLflow yet)")
