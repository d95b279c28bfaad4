"""Runner: one attempt of a trial, in-process (no Ray). Real MLflow (SQLite), real verdict engine;
the backend is the deterministic double of ``tests/doubles.py`` (the sim's own checkpoint/resume
equivalence is tested with the sim)."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import doubles
import pytest
from rayclusters import write_grid
from trialrecords import mlflow_steps

from orchestrator.exceptions import CheckpointError, InfraFailure
from orchestrator.grid import expand, load_grid
from orchestrator.run import make_job, run_attempt
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.tracking import TrackingTarget


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One store for the module: creating MLflow's SQLite schema costs seconds per test.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def env(isolated: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str):
    doubles.register(monkeypatch)
    monkeypatch.setenv("ABLATE_DOUBLE_STEP_S", "0.005")
    path = write_grid(isolated / "grid.yaml", "runner-test", steps=20, seeds=[0],
                      levels=["none", "token"], pools=["sim-h100", "sim-a100"], budget=None,
                      retries=None, tiny=False, extra="early_stop: {margin: 0}\n")
    grid = load_grid(path)
    trials = {(t.axis_values["correction.is_level"], t.pool): t for t in expand(grid)}
    from orchestrator.tracking import GridRun

    uri = mlflow_uri
    parent = GridRun.open(grid, tracking_uri=uri, workdir=workspace.workdir())
    tracking = TrackingTarget(uri, parent.experiment_id, parent.run_id)
    grid_dir = workspace.grid_dir(grid.name)

    def job(trial, **kw):
        return make_job(grid, trial, grid_dir=grid_dir, tracking=tracking, submission="s-test", **kw)

    return grid, trials, grid_dir, job, uri


def _file_steps(grid_dir: Path, tid: str) -> list[int]:
    return [s for s, _ in records.iter_metrics(TrialPaths(grid_dir, tid).metrics)]


def test_healthy_trial_runs_to_the_end(env) -> None:
    _grid, trials, grid_dir, job, uri = env
    t = trials[("token", "sim-h100")]
    out = run_attempt(job(t))
    assert out["state"] == "done" and out["outcome"] == "completed" and out["last_step"] == 20
    assert out["verdict"]["kind"] == "healthy"
    # Not an fp16 learner, so no loss scaler: the default fp16 rule did not run, and says so.
    assert list(out["verdict"]["not_applicable"]) == ["fp16_skipped_updates"]
    assert out["verdict"]["reason"].endswith("not applicable to this trial: fp16_skipped_updates")
    rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
    assert rec.committed_step == 20 and rec.attempts == 1
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(rec.mlflow_run_id).data.tags
    assert "fp16_skipped_updates" in tags["verdict.not_applicable"]
    assert _file_steps(grid_dir, t.trial_id) == list(range(1, 21))
    assert mlflow_steps(uri, rec.mlflow_run_id, "critic/score/mean") == list(range(1, 21))
    store_steps = sorted(int(p.name.split("-")[1]) for p in TrialPaths(grid_dir, t.trial_id)
                         .checkpoints.glob("step-*"))
    assert store_steps == [15, 20]  # keep: 2 (step 20 is also the protected healthy one)
    # A second run of a finished trial runs nothing.
    again = run_attempt(job(t))
    assert again["attempt"] == 1 and len(records.load_attempts(TrialPaths(grid_dir, t.trial_id))) == 1


def test_a_fresh_rerun_replaces_the_trials_run_instead_of_adding_one(env) -> None:
    """``ablate run-trial --fresh`` starts the trial's record anew: its old run is superseded
    (soft-deleted, pointing at the new one), so the trial keeps one live run."""
    from mlflow.tracking import MlflowClient

    _grid, trials, grid_dir, job, uri = env
    t = trials[("none", "sim-h100")]
    paths = TrialPaths(grid_dir, t.trial_id)
    run_attempt(job(t))
    first = records.load_state(paths, t.trial_id).mlflow_run_id
    run_attempt(job(t, start="fresh", reopen=True))
    second = records.load_state(paths, t.trial_id).mlflow_run_id
    mlc = MlflowClient(uri)
    old = mlc.get_run(first)
    assert second != first and old.info.lifecycle_stage == "deleted"
    assert old.data.tags["superseded_by"] == second
    live = [r.info.run_id for e in mlc.search_experiments()
            for r in mlc.search_runs([e.experiment_id], filter_string=f"tags.trial_id = '{t.trial_id}'")]
    assert live == [second]
    assert mlflow_steps(uri, second, "critic/score/mean") == list(range(1, 21))


def test_infra_failure_resumes_from_checkpoint_without_gaps_or_duplicates(env, tmp_path, monkeypatch) -> None:
    _grid, trials, grid_dir, job, uri = env
    t = trials[("token", "sim-a100")]
    monkeypatch.setenv("ABLATE_DOUBLE_FAIL_ONCE", str(tmp_path))
    with pytest.raises(RuntimeError, match="injected"):
        run_attempt(job(t))
    paths = TrialPaths(grid_dir, t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    attempts = records.load_attempts(paths)
    assert rec.state.value == "pending" and "injected" in rec.error
    assert [(a.outcome, a.start_step, a.end_step) for a in attempts] == [("infra_failure", 1, 6)]
    # Commit-on-checkpoint: MLflow has only what the checkpoint at step 5 covers.
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == [1, 2, 3, 4, 5]
    out = run_attempt(job(t))
    attempts = records.load_attempts(paths)
    assert out["state"] == "done" and len(attempts) == 2
    assert (attempts[1].resumed_from_step, attempts[1].start_step, attempts[1].end_step) == (5, 6, 20)
    assert _file_steps(grid_dir, t.trial_id) == list(range(1, 21))
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == list(range(1, 21))
    # The resumed run equals an uninterrupted one (the double's state is in its checkpoint).
    monkeypatch.delenv("ABLATE_DOUBLE_FAIL_ONCE")
    ref = trials[("token", "sim-h100")]
    run_attempt(job(ref))
    got = [m["acc"] for _, m in records.iter_metrics(paths.metrics)]
    want = [m["acc"] for _, m in records.iter_metrics(TrialPaths(grid_dir, ref.trial_id).metrics)]
    assert got == pytest.approx(want)


def test_a_failure_before_the_attempt_runs_is_recorded_with_its_own_reason(env, monkeypatch) -> None:
    """An attempt that fails after its record is written but before the trial is marked running
    (opening its MLflow run, say) goes back to PENDING with its own error, not an illegal
    PENDING -> PENDING that hid it (CI, stop 49), and the next attempt runs the trial."""
    from orchestrator.run._start import AttemptStart

    _grid, trials, grid_dir, job, _uri = env
    t = trials[("none", "sim-a100")]
    real = AttemptStart._open_tracking

    def refused(self) -> None:
        raise OSError("tracking store refused the run")

    monkeypatch.setattr(AttemptStart, "_open_tracking", refused)
    with pytest.raises(OSError, match="refused"):
        run_attempt(job(t))
    paths = TrialPaths(grid_dir, t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    assert rec.state.value == "pending" and rec.error == "OSError: tracking store refused the run"
    assert [a.outcome for a in records.load_attempts(paths)] == ["infra_failure"]
    monkeypatch.setattr(AttemptStart, "_open_tracking", real)
    out = run_attempt(job(t))
    assert out["state"] == "done" and out["attempt"] == 2


def test_the_space_a_stopped_trial_still_needs_is_estimated_from_its_own_files(
        env, tmp_path, monkeypatch) -> None:
    """What the disk-full line says a trial still needs (``scheduler._faults.space_needed``),
    against what its files then grow by: within 2x, as the full-tmpfs test asks of a grid. Its
    checkpoints count as many as retention keeps at its end; scaling them with the steps, as
    growing files are, counted every checkpoint ever saved (CI, stop 49: 2.2x, over its
    disk-full test's 2x bound)."""
    from orchestrator.scheduler._faults import space_needed, tree_size

    grid, trials, grid_dir, job, _uri = env
    t = trials[("token", "sim-h100")]
    monkeypatch.setenv("ABLATE_DOUBLE_FAIL_ONCE", str(tmp_path))
    with pytest.raises(RuntimeError, match="injected"):
        run_attempt(job(t))  # stops at step 6, its checkpoint at step 5 saved
    monkeypatch.delenv("ABLATE_DOUBLE_FAIL_ONCE")
    root = TrialPaths(grid_dir, t.trial_id).root
    before = tree_size(root)
    need = space_needed(grid_dir, [t], grid.spec.checkpoint)
    assert run_attempt(job(t))["last_step"] == 20
    grown = tree_size(root) - before
    assert need is not None and grown / 2 <= need <= grown * 2, (need, grown)


def test_deferred_attempts_fill_the_outbox_and_the_sender_finishes_the_run(env, tmp_path, monkeypatch) -> None:
    """Inside Ray the scheduler defers MLflow (tracking/_deferred.py): the worker never talks to the store,
    a failed attempt and its retry share one outbox, and the sender creates, fills and ends
    the run afterwards: the same run a live attempt would have made."""
    from mlflow.tracking import MlflowClient

    from orchestrator.tracking import send_trial

    grid, trials, grid_dir, job, uri = env
    t = trials[("none", "sim-h100")]

    def deferred():
        return dataclasses.replace(job(t), defer_tracking=True)

    began = time.time() * 1000
    monkeypatch.setenv("ABLATE_DOUBLE_FAIL_ONCE", str(tmp_path))
    with pytest.raises(RuntimeError, match="injected"):
        run_attempt(deferred())
    monkeypatch.delenv("ABLATE_DOUBLE_FAIL_ONCE")
    paths = TrialPaths(grid_dir, t.trial_id)
    out = run_attempt(deferred())
    done = time.time() * 1000
    time.sleep(0.3)  # the run is created later: its times must still be the trial's own
    rec = records.load_state(paths, t.trial_id)
    assert out["state"] == "done" and rec.mlflow_run_id is None  # nothing sent from the slot
    target = TrackingTarget(uri, job(t).tracking.experiment_id, job(t).tracking.parent_run_id)
    assert send_trial(grid, grid_dir, t.trial_id, target)
    rec = records.load_state(paths, t.trial_id)
    run = MlflowClient(uri).get_run(rec.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["attempts"] == "2"
    assert began <= run.info.start_time < run.info.end_time <= done  # when the attempts ran
    assert run.data.tags["verdict"] == out["verdict"]["kind"]
    assert run.data.params["correction.is_level"] == "none"
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == list(range(1, out["last_step"] + 1))

    # A sender killed after its last send but before writing state.json: the next one records
    # the run id the outbox holds (it used to return early on an empty outbox).
    sent_to = rec.mlflow_run_id
    rec.mlflow_run_id = None
    records.save_state(paths, rec)
    assert send_trial(grid, grid_dir, t.trial_id, target)
    assert records.load_state(paths, t.trial_id).mlflow_run_id == sent_to


def _hold_briefly(lock_path: Path, then=lambda: None, seconds: float = 0.5) -> None:
    """Another holder of a trial's run lock (its own thread: filelock locks are per thread) that
    runs ``then`` and lets go after ``seconds``; returns once the lock is held."""
    from filelock import FileLock

    held = threading.Event()

    def hold() -> None:
        with FileLock(str(lock_path)):
            held.set()
            time.sleep(seconds)
            then()

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)


def test_a_finished_trial_whose_outbox_was_never_closed_is_closed_from_its_records(env) -> None:
    """The runner saves the trial's end, then gives the outbox the verdict, attempts and end
    status: a worker stopped in between leaves an outbox that would make a run stuck RUNNING with
    no verdict. The sender closes it from state.json and attempts.json."""
    import json

    from mlflow.tracking import MlflowClient

    from orchestrator.tracking import send_trial

    grid, trials, grid_dir, job, uri = env
    t = trials[("none", "sim-a100")]  # collapses: a verdict with a step and a rule
    out = run_attempt(dataclasses.replace(job(t), defer_tracking=True))
    paths = TrialPaths(grid_dir, t.trial_id)
    buf = paths.outbox
    state = json.loads((buf / "run.json").read_text())
    (buf / "run.json").write_text(json.dumps({**state, "end_status": None, "ended_ms": None}))
    (buf / "tags.json").unlink()
    for artifact in (buf / "artifacts").iterdir():
        artifact.unlink()
    target = TrackingTarget(uri, job(t).tracking.experiment_id, job(t).tracking.parent_run_id)
    assert send_trial(grid, grid_dir, t.trial_id, target)
    run = MlflowClient(uri).get_run(records.load_state(paths, t.trial_id).mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["verdict"] == out["verdict"]["kind"] == "collapsed"
    assert run.data.tags["verdict.step"] == str(out["verdict"]["step"])
    assert run.data.tags["attempts"] == "1" and run.data.tags["attempt.1.outcome"] == "stopped_early"
    names = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)}
    assert {"verdict.json", "attempts.json"} <= names


def test_the_sender_waits_for_the_trials_run_lock(env) -> None:
    """A worker still ending its attempt holds the run lock: the sender does not write the outbox
    beside it, and leaves it for later when the lock stays held."""
    from filelock import FileLock

    from orchestrator.tracking import send_trial

    grid, trials, grid_dir, job, uri = env
    t = trials[("token", "sim-h100")]
    out = run_attempt(dataclasses.replace(job(t), defer_tracking=True))
    paths = TrialPaths(grid_dir, t.trial_id)
    target = TrackingTarget(uri, job(t).tracking.experiment_id, job(t).tracking.parent_run_id)
    with FileLock(str(paths.run_lock)):
        assert not send_trial(grid, grid_dir, t.trial_id, target, timeout=0.3)
    assert records.load_state(paths, t.trial_id).mlflow_run_id is None
    _hold_briefly(paths.run_lock)
    assert send_trial(grid, grid_dir, t.trial_id, target, timeout=20)
    rec = records.load_state(paths, t.trial_id)
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == list(range(1, out["last_step"] + 1))


def test_a_submission_judges_a_trial_after_its_old_worker_lets_go(env) -> None:
    """A killed orchestrator's worker may still finish its attempt: the next submission waits for
    the run lock, so it sees the trial done (not running, to be reset and rerun)."""
    from orchestrator.scheduler._bookkeeping import prepare_records
    from orchestrator.trial import TrialState

    _grid, trials, grid_dir, _job, _uri = env
    t = trials[("none", "sim-h100")]
    paths = TrialPaths(grid_dir, t.trial_id)
    records.save_spec(paths, t)
    rec = records.load_state(paths, t.trial_id)
    rec.state = TrialState.PENDING
    records.save_state(paths, rec)
    rec.state = TrialState.RUNNING
    records.save_state(paths, rec)

    def finish() -> None:
        rec.state = TrialState.DONE
        records.save_state(paths, rec)

    _hold_briefly(paths.run_lock, then=finish)
    todo, finished = prepare_records(grid_dir, [t])
    assert finished == [t.trial_id] and todo == []
    assert records.load_state(paths, t.trial_id).state is TrialState.DONE


def test_a_long_deferred_attempt_goes_live_at_a_checkpoint(env, monkeypatch) -> None:
    from orchestrator.tracking import DeferredRun

    _grid, trials, grid_dir, job, uri = env
    t = trials[("token", "sim-a100")]
    monkeypatch.setattr(DeferredRun, "LIVE_AFTER_S", 0.0)  # every attempt counts as long
    out = run_attempt(dataclasses.replace(job(t), defer_tracking=True))
    rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
    assert out["state"] == "done" and rec.mlflow_run_id is not None
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == list(range(1, 21))


@pytest.mark.parametrize("level", ["token", "none"])  # completed / stopped early (a collapse)
def test_a_death_between_the_attempts_end_and_the_trials_state_is_not_a_second_attempt(
        env, level) -> None:
    """The runner writes an attempt's end, then the trial's state: a process killed between the
    two (it happened in CI when the orchestrator was SIGKILLed) left a "completed" attempt on a
    RUNNING trial. The next run finishes that attempt; it must not add a second one."""
    from mlflow.tracking import MlflowClient

    from orchestrator.trial import TrialState

    _grid, trials, grid_dir, job, uri = env
    t = trials[(level, "sim-a100")]
    first = run_attempt(job(t))
    paths = TrialPaths(grid_dir, t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    rec.state = TrialState.RUNNING  # the state as it was before the lost write
    records.save_state(paths, rec)
    again = run_attempt(job(t))
    attempts = records.load_attempts(paths)
    assert [a.outcome for a in attempts] == [first["outcome"] if first["outcome"] == "completed"
                                             else "stopped_early"]
    assert attempts[0].start_step == 1 and attempts[0].end_step == first["last_step"]
    rec = records.load_state(paths, t.trial_id)
    assert rec.state is TrialState.DONE and again["last_step"] == first["last_step"]
    assert again["verdict"]["kind"] == first["verdict"]["kind"]
    steps = list(range(1, first["last_step"] + 1))
    assert [s for s, _ in records.iter_metrics(paths.metrics)] == steps
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == steps
    assert MlflowClient(uri).get_run(rec.mlflow_run_id).data.tags["attempts"] == "1"


def test_collapse_is_a_result_stopped_early(env) -> None:
    _grid, trials, grid_dir, job, uri = env
    t = trials[("none", "sim-a100")]
    out = run_attempt(job(t))
    assert out["state"] == "done" and out["outcome"] == "stopped"
    assert out["verdict"]["kind"] == "collapsed" and out["verdict"]["stopped_early"]
    assert out["last_step"] < 20
    paths = TrialPaths(grid_dir, t.trial_id)
    assert [a.outcome for a in records.load_attempts(paths)] == ["stopped_early"]
    # The last checkpoints that looked healthy are protected; one is before the onset (step 9).
    from orchestrator.store import CheckpointStore

    store = CheckpointStore(paths.checkpoints, trial_id=t.trial_id)
    assert store.protected() == {5, 10} and 5 in store.steps()
    assert out["verdict"]["step"] == 9
    rec = records.load_state(paths, t.trial_id)
    assert mlflow_steps(uri, rec.mlflow_run_id, "acc") == list(range(1, out["last_step"] + 1))


def test_cancel_request_stops_a_running_trial(env, monkeypatch) -> None:
    _grid, trials, grid_dir, job, _uri = env
    monkeypatch.setenv("ABLATE_DOUBLE_STEP_S", "0.1")
    t = trials[("token", "sim-h100")]
    box: dict = {}
    th = threading.Thread(target=lambda: box.setdefault("out", run_attempt(job(t))))
    th.start()
    time.sleep(1.0)
    records.add_cancel_requests(grid_dir, [t.trial_id])
    th.join(30)
    out = box["out"]
    assert out["state"] == "cancelled" and out["outcome"] == "cancelled" and out["last_step"] < 20
    assert records.cancel_requests(grid_dir) == {}
    assert records.load_attempts(TrialPaths(grid_dir, t.trial_id))[-1].outcome == "cancelled"


def test_bad_explicit_resume_step_changes_nothing(env) -> None:
    _grid, trials, grid_dir, job, _uri = env
    t = trials[("token", "sim-h100")]
    run_attempt(job(t))
    paths = TrialPaths(grid_dir, t.trial_id)
    before = {p.name: p.read_bytes() for p in (paths.state, paths.attempts, paths.metrics)}
    with pytest.raises(CheckpointError, match=f"trial {t.trial_id}: checkpoint step 7 .*does not exist"):
        run_attempt(job(t, start=7, reopen=True))
    assert {p.name: p.read_bytes() for p in (paths.state, paths.attempts, paths.metrics)} == before


def test_trial_lock_prevents_running_twice(env) -> None:
    from filelock import FileLock

    _grid, trials, grid_dir, job, _uri = env
    t = trials[("token", "sim-h100")]
    paths = TrialPaths(grid_dir, t.trial_id)
    paths.root.mkdir(parents=True, exist_ok=True)
    import dataclasses

    with FileLock(str(paths.root / ".run.lock")), pytest.raises(InfraFailure, match="still running"):
        run_attempt(dataclasses.replace(job(t), lock_timeout=0.3))
    assert not paths.metrics.exists()


def test_a_finished_trial_writes_its_summary_and_stamp(env) -> None:
    """The runner checks the closed metrics file once at the trial's end: the stamp goes to
    state.json, the summary to summary.json and its scalars to the MLflow run's tags."""
    from orchestrator.store import summary
    from orchestrator.tracking import client

    _grid, trials, grid_dir, job, uri = env
    t = trials[("none", "sim-a100")]
    run_attempt(job(t))
    paths = TrialPaths(grid_dir, t.trial_id)
    rec = records.load_state(paths, t.trial_id)
    stamp = summary.Stamp.from_json(rec.metrics_stamp)
    last = rec.last_step  # this trial collapses and stops early
    assert last > 5 and stamp is not None and stamp.matches(paths.metrics) and stamp.good_through == last
    s = summary.read_summary(paths)
    assert s is not None and s.last_step == last and s.stamp == stamp
    rows = dict(records.iter_metrics(paths.metrics))
    key = "critic/score/mean"
    assert s.final[key] == rows[last][key] and s.peak[key] == max(r[key] for r in rows.values())
    assert s.curves[key] == [(step, rows[step][key]) for step in range(1, last + 1)]
    tags = client(uri).get_run(rec.mlflow_run_id).data.tags
    assert summary.from_tags(tags) == (s.final, s.peak, s.points)
    # A resumed trial's file changes: the stamp is dropped while it runs.
    paths.metrics.write_text(paths.metrics.read_text() + "{torn")
    assert not stamp.matches(paths.metrics)
    assert summary.stamped_check(paths, rec).torn


def test_tracking_every_sends_a_share_of_the_steps_but_every_step_a_verdict_names(env) -> None:
    """`tracking: {every: N}` (N = 6 here): MLflow gets the N-th steps, each checkpoint's step, the last step
    and the steps the verdict names (the onset 9 of a rule that fired at a later checkpoint);
    metrics.jsonl keeps every step, and the summary tags hold the exact final and peak values."""
    from orchestrator.store import summary
    from orchestrator.tracking import client

    _grid, trials, grid_dir, job, uri = env
    for key, want_kind in ((("none", "sim-a100"), "collapsed"), (("token", "sim-h100"), "healthy")):
        t = trials[key]
        out = run_attempt(dataclasses.replace(job(t), tracking_every=6))
        assert out["verdict"]["kind"] == want_kind
        last, paths = out["last_step"], TrialPaths(grid_dir, t.trial_id)
        assert _file_steps(grid_dir, t.trial_id) == list(range(1, last + 1))
        rec = records.load_state(paths, t.trial_id)
        sent = mlflow_steps(uri, rec.mlflow_run_id, "acc")
        assert len(sent) == len(set(sent)) < last
        must = {s for s in range(6, last + 1, 6)} | {s for s in (5, 10, 15) if s <= last} | {last}
        if want_kind == "collapsed":
            assert out["verdict"]["step"] == 9 and last > 10  # onset before the checkpoint at 10
            must.add(9)
        assert must <= set(sent), sorted(must - set(sent))
        s = summary.read_summary(paths)
        assert summary.from_tags(client(uri).get_run(rec.mlflow_run_id).data.tags) == (s.final, s.peak, s.points)
        # compare without the workdir: the tables' final and peak values are the summary's
        # (exact), not those of the thinned curves MLflow holds.
        from orchestrator.compare._data import load_results

        mlc = client(uri)
        got = {r.trial_id: r for r in load_results(mlc, rec_experiment(mlc, rec.mlflow_run_id), [],
                                                   grid_dir=None, tracking_uri=uri)}[t.trial_id]
        assert (got.finals, got.peaks, got.last_step) == (s.final, s.peak, last)
        if want_kind == "healthy":  # the thinned history misses k3's peaks (steps 4, 9, 14, 19)
            k3 = "rollout_corr/k3_kl"
            assert max(m.value for m in mlc.get_metric_history(rec.mlflow_run_id, k3)) < s.peak[k3]


def rec_experiment(mlc, run_id: str) -> str:
    return mlc.get_run(run_id).info.experiment_id


def test_tracking_every_reaches_the_job_and_bad_values_are_refused(isolated: Path) -> None:
    from orchestrator.exceptions import UserError

    path = write_grid(isolated / "grid.yaml", "every-test", steps=20, seeds=[0], levels=["none"],
                      pools=["sim-h100"], extra="tracking: {every: 10}\n")
    grid = load_grid(path)
    job = make_job(grid, expand(grid)[0], grid_dir=isolated, tracking=None, submission="s")
    assert job.tracking_every == 10
    for bad in ("0", "-3", "2.5", "'ten'"):
        write_grid(path, "every-test", steps=20, seeds=[0], levels=["none"], pools=["sim-h100"],
                   extra=f"tracking: {{every: {bad}}}\n")
        with pytest.raises(UserError) as err:
            load_grid(path)
        assert "\n" not in str(err.value) and "tracking.every" in str(err.value), str(err.value)


def test_tracked_rows_keep_sparse_metrics_named_steps_and_the_last() -> None:
    from orchestrator.run._commits import tracked_rows

    rows = [(s, {"loss": 1.0, **({"eval/reward": 0.5} if s % 7 == 0 else {})}) for s in range(1, 31)]
    kept, prev = tracked_rows(rows, 10, {13}, frozenset())
    assert [s for s, _ in kept] == [1, 7, 10, 13, 14, 20, 21, 28, 30]
    assert prev == frozenset({"loss"})
    # The next commit goes on from the last row's names: a dense row is thinned at once.
    assert [s for s, _ in tracked_rows([(31, {"loss": 2.0}), (32, {"loss": 2.0})], 10, set(), prev)[0]] == [32]
