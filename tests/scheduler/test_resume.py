"""``ablate resume`` on the real CPU simulator, real MLflow (SQLite) and, once, the real Ray Tune
scheduler (through ``ablate submit``'s ``on_collapse`` rescue).

Collapse at this tiny scale (12 steps) is made real by an explicit ``above`` rule on the k3 KL
the simulator measures: sim-a100 (int4 weights, fp8 LM head, weights two syncs stale) reaches
k3 ~3e-3 from step 2, sim-h20 (fp16 with an fp32 LM head) stays near 5e-9. ``min_step: 6`` puts
the onset at step 6, so the healthy checkpoint is step 3 (``checkpoint.every: 3``).
"""
from __future__ import annotations

import json
from pathlib import Path

import cliproc
import pytest
from rayclusters import write_grid

from orchestrator.cli import main
from orchestrator.exceptions import CheckpointError, UserError
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.scheduler import resume
from orchestrator.store import TrialPaths, records, workspace

K3 = "rollout_corr/k3_kl"
GRID = """\
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: 12
seeds: [0]
axes:
  pool: [{pool}]
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  eval.every: 100
checkpoint: {{every: 3, keep: {keep}{store}}}
collapse:
  rules:
    - {{name: k3_high, metric: {k3}, kind: above, threshold: 0.001, patience: 2, min_step: 6}}
  early_warning: false
early_stop: {{margin: 0}}
{extra}"""


def _grid(tmp: Path, name: str = "rs", pool: str = "sim-a100", keep: int = 2, store: str = "",
          extra: str = "") -> tuple[str, object, object]:
    path = tmp / f"{name}.yaml"
    path.write_text(GRID.format(name=name, pool=pool, keep=keep, k3=K3, extra=extra,
                                store=f", store: '{store}'" if store else ""))
    grid = load_grid(path)
    (trial,) = expand(grid)
    return str(path), grid, trial


def _mlc():
    from mlflow import MlflowClient

    return MlflowClient(workspace.tracking_uri(None, None))


def _active_runs(trial_id: str) -> list:
    mlc = _mlc()
    return [r for e in mlc.search_experiments() for r in
            mlc.search_runs([e.experiment_id], filter_string=f"tags.trial_id = '{trial_id}'")]


def _history(run_id: str, key: str = K3) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in _mlc().get_metric_history(run_id, key))


def _snapshot(grid_dir: Path, tid: str) -> dict:
    paths = TrialPaths(grid_dir, tid)
    files = {p.name: p.read_bytes() for p in (paths.state, paths.attempts, paths.metrics)}
    runs = {r.info.run_id: (r.info.lifecycle_stage, r.info.status, dict(r.data.tags),
                            _history(r.info.run_id)) for r in _active_runs(tid)}
    return {"files": files, "runs": runs, "dirs": sorted(p.name for p in (grid_dir / "trials").iterdir())}


def _numbers(path: Path) -> list[tuple[int, dict[str, float]]]:
    """Metric rows without wall-clock timings (the only values a rerun may change)."""
    return [(s, {k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/time"))})
            for s, m in records.iter_metrics(path)]


def test_collapsed_trial_resumes_on_low_mismatch_pool_with_one_mlflow_step_axis(isolated: Path) -> None:
    path, grid, t = _grid(isolated)
    out = run_single(path, t.trial_id)
    assert out["verdict"]["kind"] == "collapsed" and out["verdict"]["step"] == 6
    assert out["last_step"] == 7  # stopped early: the rule fired at step 7
    grid_dir = workspace.grid_dir(grid.name)
    paths = TrialPaths(grid_dir, t.trial_id)
    old_run = records.load_state(paths, t.trial_id).mlflow_run_id
    assert [s for s, _ in _history(old_run)] == list(range(1, 8))
    collapsed_tail = [(s, m[K3]) for s, m in records.iter_metrics(paths.metrics) if s > 3]

    got = resume(path, select="collapsed", pool="sim-h20", local=True)
    assert got["resumed"] == [{"trial_id": t.trial_id, "parent": t.trial_id, "pool": "sim-h20",
                               "from_step": 3, "derived": False}]
    result = got["results"][t.trial_id]
    assert result["verdict"]["kind"] == "healthy" and result["last_step"] == 12
    rec = records.load_state(paths, t.trial_id)
    assert rec.pool == "sim-h20" and rec.superseded_runs == [old_run] and rec.resume is None
    attempts = records.load_attempts(paths)
    assert [(a.pool, a.start_step, a.end_step, a.outcome) for a in attempts] == [
        ("sim-a100", 1, 7, "stopped_early"), ("sim-h20", 4, 12, "completed")]
    # MLflow: exactly one active run for the trial, steps 1..12 once each.
    (run,) = _active_runs(t.trial_id)
    assert run.info.run_id == rec.mlflow_run_id != old_run
    for key in (K3, "critic/score/mean"):
        steps = [s for s, _ in _history(run.info.run_id, key)]
        assert steps == list(range(1, 13)), key
    tags = run.data.tags
    assert tags["pools"] == "sim-a100,sim-h20" and tags["pool_steps"] == "sim-a100:1-3,sim-h20:4-12"
    assert tags["attempt.1.steps"] == "1-7" and tags["attempt.2.steps"] == "4-12"
    assert tags["attempt.2.resumed_from_step"] == "3" and tags["supersedes"] == old_run
    assert tags["verdict"] == "healthy" and tags["resume.pool"] == "sim-h20"
    # The values are the local file's: a100's steps 1-3, then h20's (mismatch ~1e-9).
    local = {s: m[K3] for s, m in records.iter_metrics(paths.metrics)}
    assert dict(_history(run.info.run_id)) == pytest.approx(local, rel=1e-6)
    assert max(local[s] for s in range(5, 13)) < 1e-6 < min(v for _, v in collapsed_tail)
    # The superseded run is kept (soft-deleted, linked) and the collapse stays visible.
    old = _mlc().get_run(old_run)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["superseded_by"] == run.info.run_id
    tail = json.loads(Path(_mlc().download_artifacts(run.info.run_id, f"superseded-{old_run}.json")).read_text())
    assert [r["step"] for r in tail["rows"]] == [s for s, _ in collapsed_tail] == [4, 5, 6, 7]
    assert [r["metrics"][K3] for r in tail["rows"]] == pytest.approx([v for _, v in collapsed_tail])
    assert [s for s, _ in records.iter_metrics(paths.root / "superseded" / "attempt-2.jsonl")] == [4, 5, 6, 7]
    # compare reads one continuous curve with the pool change as a second segment.
    from orchestrator.compare import load_results

    (res,) = load_results(_mlc(), run.info.experiment_id, ["pool"], grid_dir)
    assert [s for s, _ in res.curves[K3]] == list(range(1, 13))
    assert [(g.pool, g.start) for g in res.segments] == [("sim-a100", 1), ("sim-h20", 4)]
    assert [s for s, _ in res.superseded[0][K3]] == [4, 5, 6, 7]
    from orchestrator.compare._plots import curves

    png = curves([res], K3, None, None, isolated / "k3.png", title="k3", log_y=True)
    assert png is not None and png.stat().st_size > 10_000


def test_derived_resume_with_set_is_a_separate_linked_trial(isolated: Path) -> None:
    path, grid, t = _grid(isolated)
    run_single(path, t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    parent_before = _snapshot(grid_dir, t.trial_id)
    got = resume(path, trial_ids=[t.trial_id], pool="sim-a100", start=6,
                 sets={"correction.is_level": "geometric"}, local=True)
    (item,) = got["resumed"]
    child = item["trial_id"]
    assert item["derived"] and child != t.trial_id and item["from_step"] == 6
    spec = records.load_spec(TrialPaths(grid_dir, child))
    assert spec.derived_from == (t.trial_id, 6) and spec.override_map["correction.is_level"] == "geometric"
    # The parent is untouched (files and MLflow), the child has its own run tagged with the link.
    after = _snapshot(grid_dir, t.trial_id)
    assert after["files"] == parent_before["files"] and after["runs"] == parent_before["runs"]
    (run,) = _active_runs(child)
    assert run.data.tags["derived_from"] == f"{t.trial_id}@6"
    assert run.data.params["correction.is_level"] == "geometric"
    # Its history is the parent's steps 1-6, then its own from 7 (still a100: over the k3
    # threshold again, so the inherited onset at step 6 plus step 7 stop it).
    assert [s for s, _ in _history(run.info.run_id)] == list(range(1, 8))
    cpaths = TrialPaths(grid_dir, child)
    parent_rows = list(records.iter_metrics(TrialPaths(grid_dir, t.trial_id).metrics))[:6]
    assert list(records.iter_metrics(cpaths.metrics))[:6] == parent_rows
    assert [(a.outcome, a.start_step, a.end_step) for a in records.load_attempts(cpaths)] == [
        ("inherited", 1, 6), ("stopped_early", 7, 7)]
    assert run.data.tags["verdict"] == "collapsed"


def test_derive_keeps_the_collapsed_parent_and_rescues_a_copy_on_another_pool(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    path, grid, t = _grid(isolated)
    run_single(path, t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    parent_before = _snapshot(grid_dir, t.trial_id)
    # `--derive` with no --set
    got = resume(path, select="collapsed", pool="sim-h20", derive=True, local=True)
    (item,) = got["resumed"]
    child = item["trial_id"]
    assert item["derived"] and child != t.trial_id and item["pool"] == "sim-h20"
    assert item["from_step"] == 3  # last healthy checkpoint before the verdict step 6
    assert _snapshot(grid_dir, t.trial_id)["files"] == parent_before["files"]  # still collapsed
    spec = records.load_spec(TrialPaths(grid_dir, child))
    assert spec.pool == "sim-h20" and spec.derived_from == (t.trial_id, 3)
    assert got["results"][child]["verdict"]["kind"] == "healthy"
    (run,) = _active_runs(child)
    assert [s for s, _ in _history(run.info.run_id)] == list(range(1, 13))
    # the same derivation again is refused, naming the trial to use instead; nothing changes
    before = _snapshot(grid_dir, child)
    capsys.readouterr()
    assert main(["resume", path, "--trial", t.trial_id, "--pool", "sim-h20", "--derive"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--trial {child}" in err[0], err
    assert _snapshot(grid_dir, child) == before


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_missing_or_corrupt_checkpoint_fails_and_changes_nothing(isolated: Path, damage: str) -> None:
    path, grid, t = _grid(isolated)
    run_single(path, t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    ckpt = TrialPaths(grid_dir, t.trial_id).checkpoints / "step-00000003"
    if damage == "missing":
        import shutil

        shutil.rmtree(ckpt)
    else:
        blob = next(p for p in ckpt.iterdir() if p.name != "MANIFEST.json")
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
    before = _snapshot(grid_dir, t.trial_id)
    needle = "no checkpoint before step 6" if damage == "missing" else "does not match its SHA-256"
    with pytest.raises(CheckpointError, match=needle) as info:
        resume(path, select="collapsed", pool="sim-h20", local=True)
    assert "\n" not in str(info.value) and t.trial_id in str(info.value)
    with pytest.raises(CheckpointError, match="checkpoint step 3 .*(does not exist|SHA-256)"):
        resume(path, trial_ids=[t.trial_id], pool="sim-h20", start=3, local=True)
    assert _snapshot(grid_dir, t.trial_id) == before


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_resume_on_same_pool_reproduces_the_uninterrupted_run(isolated: Path, scheme: str) -> None:
    import fsspec

    url = f"file://{isolated}/store" if scheme == "file" else f"memory://{isolated.name}/store"
    path, grid, t = _grid(isolated, name="same", pool="sim-h20", keep=10, store=url)
    out = run_single(path, t.trial_id)
    assert out["verdict"]["kind"] == "healthy" and out["last_step"] == 12
    grid_dir = workspace.grid_dir(grid.name)
    paths = TrialPaths(grid_dir, t.trial_id)
    fs, root = fsspec.core.url_to_fs(f"{url}/{t.trial_id}")
    assert sorted(n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)
                  if "step-" in n) == [f"step-{s:08d}" for s in (3, 6, 9, 12)]  # in the URL's store
    assert not paths.checkpoints.exists()
    want = _numbers(paths.metrics)
    got = resume(path, trial_ids=[t.trial_id], pool="sim-h20", start=6, local=True)
    assert got["results"][t.trial_id]["last_step"] == 12
    have = _numbers(paths.metrics)
    assert [s for s, _ in have] == list(range(1, 13)) and len(have[-1][1]) > 20
    assert have == want  # bit for bit, every metric but wall-clock timings
    (run,) = _active_runs(t.trial_id)
    assert [v for _, v in _history(run.info.run_id)] == [m[K3] for _, m in want]


def test_on_collapse_rescue_runs_once_through_the_scheduler(isolated: Path) -> None:
    import shutil
    import tempfile

    from orchestrator.scheduler import submit

    path, grid, t = _grid(isolated, name="auto", extra="on_collapse: {resume: {pool: sim-h20}}\n")
    ray_tmp = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths have a length cap
    try:
        summary = submit(path, progress=False, ray_tmp=ray_tmp)
        again = submit(path, progress=False, ray_tmp=ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert summary["rescued"] == [t.trial_id]
    grid_dir = workspace.grid_dir(grid.name)
    paths = TrialPaths(grid_dir, t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    assert rec.rescue["by"] == "on_collapse" and rec.rescue["pool"] == "sim-h20" and rec.rescue["start"] == 3
    assert rec.verdict["kind"] == "healthy" and rec.pool == "sim-h20"
    assert [(a.pool, a.start_step, a.end_step) for a in records.load_attempts(paths)] == [
        ("sim-a100", 1, 7), ("sim-h20", 4, 12)]
    (run,) = _active_runs(t.trial_id)
    assert run.data.tags["resume.reason"].startswith("on_collapse rescue")
    assert [s for s, _ in _history(run.info.run_id)] == list(range(1, 13))
    # Once: the second submit found nothing to run or rescue.
    assert again["rescued"] == [] and again["skipped_finished"] == 1
    assert len(records.load_attempts(paths)) == 2


def test_cli_bad_input_exits_2_with_one_line(isolated: Path, capsys: pytest.CaptureFixture) -> None:
    path, grid, t = _grid(isolated)
    run_single(path, t.trial_id)
    cases = {
        ("--trial", t.trial_id[:-1] + "x", "--pool", "sim-h20"): f"did you mean '{t.trial_id}'",
        ("--collapsed", "--pool", "sim-h2O"): "unknown pool 'sim-h2O'.*did you mean 'sim-h20'",
        ("--collapsed", "--pool", "h20"): "gpu pool.*sim pools",
        ("--collapsed", "--pool", "sim-h20", "--from", "5"): "checkpoint step 5 .*does not exist",
        ("--failed", "--pool", "sim-h20"): "no failed trials",
    }
    import re

    capsys.readouterr()
    for args, needle in cases.items():
        assert main(["resume", path, *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(needle, err), (args, err)
    with pytest.raises(SystemExit) as exc:
        main(["resume", path, "--collapsed", "--pool", "sim-h20", "--from", "soon"])
    assert exc.value.code == 2
    assert records.load_attempts(TrialPaths(workspace.grid_dir(grid.name), t.trial_id))[-1].number == 1


def test_unknown_selection_is_a_user_error(isolated: Path) -> None:
    path, _grid_spec, _t = _grid(isolated)
    with pytest.raises(UserError, match="has no runs"):
        resume(path, select="collapsed", pool="sim-h20", local=True)


@pytest.mark.parametrize("saved_world", [8, 16])
def test_verl_move_is_checked_for_world_size_before_anything_changes(isolated: Path, repo: Path,
                                                                    saved_world: int) -> None:
    """verl shards are keyed by world size: a checkpoint of 16 ranks cannot load on one 8-GPU
    node, and the refusal names the way out (merge to HF weights, losing optimizer state)."""
    from orchestrator.scheduler._rescue import plan
    from orchestrator.store import CheckpointStore
    from orchestrator.verl.topology import shard_names

    grid = load_grid(repo / "grids" / "seed_study.yaml")
    trial = next(t for t in expand(grid) if t.pool == "l20")
    grid_dir = workspace.grid_dir(grid.name)
    paths = TrialPaths(grid_dir, trial.trial_id)

    def write(d: Path) -> None:
        (d / "actor").mkdir()
        for name in shard_names(saved_world):
            (d / "actor" / name).write_bytes(b"shard")

    CheckpointStore.for_trial(None, paths.root, trial.trial_id, 3).save(20, write)
    if saved_world == 8:
        (p,) = plan(grid, grid_dir, [trial], pool="h20", start=20, sets={}, reason="test")
        assert (p.pool, p.start, p.derived) == ("h20", 20, False)
    else:
        with pytest.raises(CheckpointError, match="keyed by world size: the checkpoint has 16, "
                           "pool 'h20' gives 8.*merge to Hugging Face weights.*loses the optimizer"):
            plan(grid, grid_dir, [trial], pool="h20", start=20, sets={}, reason="test")
    assert not paths.state.exists()  # planning writes nothing
    with pytest.raises(UserError, match="--pool sim-h20: a sim pool.*verl backend on gpu pools"):
        plan(grid, grid_dir, [trial], pool="sim-h20", start=20, sets={}, reason="test")


def test_checkpoints_of_an_abandoned_branch_are_dropped(tmp_path: Path) -> None:
    """After a resume from step 3, an infra retry's ``latest`` must not find the old step 6."""
    from orchestrator.store import CheckpointStore

    store = CheckpointStore(tmp_path / "ck", trial_id="t1", keep=5)
    for step in (3, 6, 9):
        store.save(step, lambda d, s=step: (d / "w.bin").write_bytes(bytes([s])))
    store.protect([3, 6])
    assert store.drop_after(3) == [6, 9]
    assert store.steps() == [3] and store.latest() == 3 and store.protected() == {3}


def test_on_collapse_set_rescue_derives_a_trial_once_and_records_it(isolated: Path) -> None:
    from orchestrator.scheduler._rescue import auto_rescue

    path, grid, t = _grid(isolated, name="autoset",
                          extra="on_collapse: {resume: {set: {correction.is_level: geometric}}}\n")
    run_single(path, t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    (child,) = auto_rescue(grid, grid_dir, [t.trial_id])
    assert child.derived_from == (t.trial_id, 3) and child.pool == "sim-a100"
    rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
    assert rec.rescue["by"] == "on_collapse" and rec.rescue["trial"] == child.trial_id
    assert rec.state.value == "done" and rec.verdict["kind"] == "collapsed"  # the parent stays
    crec = records.load_state(TrialPaths(grid_dir, child.trial_id), child.trial_id)
    assert crec.state.value == "pending" and crec.resume.reason.startswith("on_collapse rescue")
    # Once: asked again (a re-submission), the same unfinished child comes back, no second one.
    assert auto_rescue(grid, grid_dir, [t.trial_id]) == [child]
    assert len(records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id).rescues) == 1


@pytest.mark.slow
def test_resume_off_a_terminal_prints_one_line_per_trial_event(tmp_path: Path) -> None:
    """``ablate resume`` in a log (stdout not a terminal) says what happens as it happens, as
    ``ablate submit`` does, then one line per resumed trial."""
    path = write_grid(tmp_path / "g.yaml", "resume-events", steps=12, seeds=[0], levels=["none"],
                      pools=["sim-a100"], budget="{max_parallel: 1}")
    with cliproc.ablate_env(tmp_path) as env:
        first = cliproc.run(["submit", str(path), "--quiet"], env, tmp_path, double=True)
        assert first.returncode == 0, first.stderr
        again = cliproc.run(["resume", str(path), "--collapsed", "--pool", "sim-h100"], env,
                            tmp_path, double=True)
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    (tid,) = [p.name for p in (tmp_path / ".ablate" / "resume-events" / "trials").iterdir()]
    started = [ln for ln in lines if " started " in f" {ln} " and tid in ln]
    finished = [ln for ln in lines if " finished " in f" {ln} " and tid in ln]
    assert len(started) == 1 and "sim-h100" in started[0] and "attempt 2" in started[0], lines
    assert len(finished) == 1 and "verdict=healthy" in finished[0], lines
    assert lines.index(started[0]) < lines.index(finished[0])
    assert lines[-1].startswith(f"{tid}: resumed on sim-h100 from step ") and \
        lines[-1].endswith("-> healthy"), lines
    # A derived trial (--set) starts once: its record of the parent's steps (an attempt of
    # outcome "inherited") began nothing and is not reported as a start.
    with cliproc.ablate_env(tmp_path) as env:
        derived = cliproc.run(["resume", str(path), "--trial", tid, "--pool", "sim-h100",
                               "--from", "5", "--set", "correction.is_level=token"], env,
                              tmp_path, double=True)
    assert derived.returncode == 0, derived.stderr
    (child,) = [p.name for p in (tmp_path / ".ablate" / "resume-events" / "trials").iterdir()
                if p.name != tid]
    started = [ln for ln in derived.stdout.splitlines() if " started " in f" {ln} "]
    assert len(started) == 1 and child in started[0] and "step 5/12 attempt 2" in started[0], \
        derived.stdout


def test_a_derived_trial_must_run_a_step_under_its_setting(isolated: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """A healthy trial that ran to its end: ``--from last-healthy`` is its last step, so a
    derived trial would run nothing and repeat the parent's numbers under the new label."""
    path, grid, t = _grid(isolated, name="healthy", pool="sim-h20")
    run_single(path, t.trial_id)
    grid_dir = workspace.grid_dir(grid.name)
    before = _snapshot(grid_dir, t.trial_id)
    capsys.readouterr()
    args = ["resume", path, "--trial", t.trial_id, "--pool", "sim-h20"]
    assert main([*args, "--set", "correction.is_level=token"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert ("--from last-healthy is step 12, its last step (steps: 12): a derived trial would run "
            "no step under its new setting") in err and "fix: --from STEP with an earlier checkpoint: 6, 9" in err
    # A key no grid may vary is refused as in a grid, before anything is written.
    assert main([*args, "--from", "9", "--set", "sim.reproducible=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sim.reproducible cannot vary between trials" in err, err
    # A preset that is not a name (a list, a mapping) is refused in one line, never a traceback.
    for bad in ("[a, b]", "{x: 1}"):
        assert main([*args, "--from", "9", "--set", f"correction.preset={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "correction.preset" in err, err
        assert "Traceback" not in err
    assert _snapshot(grid_dir, t.trial_id) == before
    # From an earlier checkpoint it runs steps 10-12 under the new setting.
    got = resume(path, trial_ids=[t.trial_id], pool="sim-h20", start=9,
                 sets={"correction.is_level": "token"}, local=True)
    (item,) = got["resumed"]
    assert item["from_step"] == 9
    rows = list(records.iter_metrics(TrialPaths(grid_dir, item["trial_id"]).metrics))
    assert [s for s, _ in rows] == list(range(1, 13))


def test_on_collapse_may_not_set_a_submission_wide_key(isolated: Path) -> None:
    from orchestrator.exceptions import GridError

    with pytest.raises(GridError, match=r"on_collapse\.resume\.set\.sim\.reproducible: "
                                        r"sim\.reproducible cannot vary between trials"):
        _grid(isolated, name="rw", extra="on_collapse: {resume: {set: {sim.reproducible: false}}}\n")
