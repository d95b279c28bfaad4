"""``ablate compare`` on a store populated in the test with real MLflow runs (SQLite)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import trackedruns
import verdict_streams as V

from orchestrator import metrics as M
from orchestrator.compare import compare, manifest, pick_axes
from orchestrator.compare._stats import mean_ci
from orchestrator.exceptions import UserError
from orchestrator.grid import derive_trial, expand
from orchestrator.tracking import GridRun, TrialRun, client
from orchestrator.trial import Attempt

GRID = """
name: cmp-test
recipe: sim/grpo_tiny
backend: sim
steps: 120
seeds: [0, 1, 2]
axes:
  correction.is_level: [none, sequence]
  pool: [sim-h100, sim-a100]
"""


def stream_for(trial, steps: int = 120) -> V.Stream:
    """Collapse depends on the pool only; reward level on the correction (for importance)."""
    ax = trial.axis_values
    seed = trial.seed + 10 * len(ax["correction.is_level"])
    rows = (V.explosion(n=steps, seed=seed, onset=80 + trial.seed, eval_every=10)
            if trial.pool == "sim-a100" else V.healthy(n=steps, seed=seed, eval_every=10))
    if ax["correction.is_level"] == "sequence":
        for _, r in rows:
            for k in (M.EVAL_REWARD, M.TRAIN_REWARD):
                if k in r:
                    r[k] += 0.1
    for s, r in rows:  # mismatch by token probability: worst for rare tokens, worse on a100
        scale = 10.0 if trial.pool == "sim-a100" else 1.0
        for i, (lo, hi) in enumerate(M.PROB_BUCKETS):
            r[M.bucket_name(lo, hi)] = scale * 1e-2 / (10 ** i) ** 0.5
    return rows


def track(uri: str, parent: GridRun, grid, trial, buf: Path, stream: V.Stream, *,
          attempts: list[Attempt] | None = None, verdict: bool = True) -> TrialRun:
    def ran(last: int, stopped: bool) -> list[Attempt]:
        return attempts or [Attempt(1, trial.pool, 1, last, "stopped" if stopped else "completed")]

    return trackedruns.track(uri, parent, grid, trial, buf, stream, ran, verdict=verdict)


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory):
    """One store for the module (populating it is the slow part); cwd and env like ``isolated``."""
    isolated = tmp_path_factory.mktemp("cmp")
    with trackedruns.isolated_module(isolated) as mp:
        mp.setenv("COLUMNS", "200")
        yield _populate(isolated)


def _populate(isolated: Path):
    gfile, grid, uri, parent = trackedruns.open_grid(isolated, "cmp.yaml", GRID)
    trials = expand(grid)
    runs = {}
    for t in trials:
        if t.pool == "sim-h100" and t.axis_values["correction.is_level"] == "none" and t.seed == 2:
            continue  # tracked below as a resumed trial
        runs[t.trial_id] = track(uri, parent, grid, t, isolated / "buf", stream_for(t))
    # A trial that ran 60 steps on a100, then resumed on h100 (one run, two attempts).
    moved = next(t for t in trials if t.pool == "sim-h100" and t.seed == 2
                 and t.axis_values["correction.is_level"] == "none")
    runs[moved.trial_id] = track(uri, parent, grid, moved, isolated / "buf", stream_for(moved),
                                 attempts=[Attempt(1, "sim-a100", 1, 60, "infra_failure"),
                                           Attempt(2, "sim-h100", 61, 120, "completed", resumed_from_step=60)])
    # A derived trial (`ablate resume --set correction.is_mode=mask`) of a collapsed one.
    base = next(t for t in trials if t.pool == "sim-a100" and t.seed == 0
                and t.axis_values["correction.is_level"] == "sequence")
    derived = derive_trial(grid, base, {"correction.is_mode": "mask"}, from_step=70)
    runs[derived.trial_id] = track(uri, parent, grid, derived, isolated / "buf",
                                   V.healthy(n=120, seed=99), verdict=False)
    parent.end()
    return grid, gfile, uri, runs, parent, derived, moved


def test_compare_tables_plots_importance_and_artifacts(populated) -> None:
    _, gfile, uri, _, parent, derived, moved = populated
    isolated = gfile.parent
    out = compare(gfile, workdir=str(isolated / ".ablate"))
    assert out == Path("results") / "cmp-test" and (isolated / out / "summary.md").exists()
    cells = pd.read_csv(out / "cells.csv")
    regular = cells[cells["variant"].isna()]
    assert len(regular) == 4 and set(regular["n"]) == {3}
    a100 = regular[regular["pool"] == "sim-a100"]
    h100 = regular[regular["pool"] == "sim-h100"]
    assert list(a100["collapse_rate"]) == [1.0, 1.0] and list(a100["median_collapse_step"]) == [81.0, 81.0]
    assert list(h100["collapse_rate"]) == [0.0, 0.0] and h100["median_collapse_step"].isna().all()
    assert (a100["max_k3_kl"].to_numpy() > 5 * h100["max_k3_kl"].to_numpy()).all()
    # Seeds aggregated: the cell's mean and CI are those of its trials' final eval rewards.
    trials = pd.read_csv(out / "trials.csv")
    cell = regular[(regular["pool"] == "sim-h100") & (regular["correction.is_level"] == "sequence")].iloc[0]
    finals = trials[(trials["pool"] == "sim-h100") & (trials["correction.is_level"] == "sequence")
                    & trials["derived_from"].isna()]["final_reward"].tolist()
    m, ci, n = mean_ci(finals)
    assert n == 3 and math.isclose(cell["final_reward"], m)
    # The interval stays inside [0, 1] (logit scale) and is close to the t interval there.
    assert 0 <= cell["final_reward_lo"] < m < cell["final_reward_hi"] <= 1 and 0 < ci < 0.5
    assert abs((cell["final_reward_hi"] - cell["final_reward_lo"]) - 2 * ci) < ci
    # The derived trial is its own row, judged from its curves since it has no verdict tag.
    drow = cells[cells["variant"].notna()]
    assert len(drow) == 1 and derived.derived_from[0] in drow.iloc[0]["variant"]
    dtrial = trials[trials["trial_id"] == derived.trial_id].iloc[0]
    assert dtrial["verdict"] == "healthy" and "judged by compare" in dtrial["verdict_reason"]
    assert dtrial["correction.is_mode"] == "mask"
    # Lineage: the resumed trial keeps both attempts and one continuous curve.
    mrow = trials[trials["trial_id"] == moved.trial_id].iloc[0]
    assert mrow["attempts"] == "1:sim-a100:1-60;2:sim-h100:61-120" and mrow["last_step"] == 120
    # Importance: collapse is driven by the pool, the reward level by the correction.
    imp = pd.read_csv(out / "importance.csv")
    col = imp[imp["target"] == "collapse_rate"].set_index("axis")["fanova_importance"]
    rew = imp[imp["target"] == "final_reward"].set_index("axis")["main_effect"]
    assert col["pool"] > col["correction.is_level"] and col["pool"] > 0.5
    assert rew["correction.is_level"] > 0.05
    # Files: markdown pivot, self-contained HTML, PNG plots.
    md = (out / "summary.md").read_text()
    assert "| correction.is_level |" in md and "pool=sim-a100" in md and "collapse 3/3 @ 81" in md
    page = (out / "summary.html").read_text()
    assert "data:image/png;base64," in page and "src='http" not in page and "href=" not in page
    for name in ("curves_reward", "curves_k3_kl", "curves_grad_norm", "mismatch_by_prob", "verdict_map",
                 "importance"):
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    # Same files as artifacts of the grid's parent run.
    arts = {a.path for a in client(uri).list_artifacts(parent.run_id, "results")}
    assert {"results/summary.md", "results/summary.html", "results/cells.csv", "results/verdict_map.png"} <= arts
    note = client(uri).get_run(parent.run_id).data.tags["mlflow.note.content"]
    assert note.startswith("# Grid `cmp-test`: comparison") and "collapse 3/3 @ 81" in note


def test_compare_pivots_by_any_two_axes(populated, capsys: pytest.CaptureFixture) -> None:
    _, gfile, *_ = populated
    isolated = gfile.parent
    out = compare(gfile, rows="pool", cols="correction.is_level", out_dir=isolated / "other",
                  workdir=str(isolated / ".ablate"))
    cells = pd.read_csv(out / "cells.csv")
    assert list(cells.columns[:2]) == ["pool", "variant"] and "correction.is_level" in cells.columns
    printed = capsys.readouterr().out
    assert "correction.is_level=none" in printed and "sim-a100" in printed


def test_compare_user_errors(populated) -> None:
    _, gfile, *_ = populated
    isolated = gfile.parent
    with pytest.raises(UserError, match="did you mean 'pool'"):
        compare(gfile, rows="pol", workdir=str(isolated / ".ablate"))
    with pytest.raises(UserError, match="did you mean 'correction.is_level'"):
        pick_axes(["correction.is_level", "pool"], "is_level", None)
    with pytest.raises(UserError, match="two different axes"):
        pick_axes(["pool", "x"], "pool", "pool")
    other = isolated / "empty"
    other.mkdir()
    with pytest.raises(UserError, match="has not run"):
        compare(gfile, workdir=str(other))


def test_compare_writes_a_manifest_and_names_no_absolute_path(populated) -> None:
    """results/<grid>/MANIFEST.json (orchestrator.compare.manifest) and the store named from the current
    directory, not by this machine's absolute path."""
    _, gfile, *_ = populated
    isolated = gfile.parent
    out = compare(gfile, out_dir="results/cmp-manifest", workdir=str(isolated / ".ablate"))
    m = json.loads((out / "MANIFEST.json").read_text())
    assert m["regenerate"] == "ablate submit cmp.yaml && ablate compare cmp.yaml --out results/cmp-manifest"
    assert m["source"] == {"grid": "cmp.yaml"} and "grid:cmp.yaml" in m["inputs"]
    assert manifest.combined(m["inputs"]) == m["inputs_sha256"]
    assert m["inputs"] == manifest.grid_inputs(gfile, grid_root=isolated)
    assert m["numerics"] and sum(e["trials"] for e in m["numerics"]) == 13
    for name in ("summary.md", "summary.html", "MANIFEST.json", "cells.csv", "trials.csv"):
        assert str(isolated) not in (out / name).read_text(), name
    assert "`sqlite:///.ablate/mlflow.db`" in (out / "summary.md").read_text()


def test_a_trial_folder_holding_another_trials_records_is_left_out(
        populated, capsys: pytest.CaptureFixture) -> None:
    """A trial folder whose spec.json is another trial's (copied by hand) is never filed into a
    cell under either id: compare names it with the fix and goes on with the other trials."""
    import shutil

    from orchestrator.store import TrialPaths, records

    grid, gfile, _uri, runs, *_ = populated
    isolated = gfile.parent
    grid_dir = isolated / ".ablate" / grid.name
    ids = sorted(runs)
    victim, donor = ids[0], ids[1]
    trials = {t.trial_id: t for t in expand(grid)}
    folder = TrialPaths(grid_dir, victim)
    records.save_spec(folder, trials[donor])  # the donor's spec in the victim's folder
    try:
        capsys.readouterr()
        out = compare(gfile, out_dir="results/cmp-foreign", workdir=str(isolated / ".ablate"))
        err = capsys.readouterr().err
        (line,) = [ln for ln in err.splitlines() if ln.startswith(f"warning: trial {victim} ")]
        assert "left out of every table" in line and f"holds the records of trial {donor}" in line
        assert "fix: " in line
        listed = pd.read_csv(out / "trials.csv")["trial_id"].tolist()
        assert victim not in listed and donor in listed and len(listed) == len(runs) - 1
    finally:
        shutil.rmtree(folder.root)
