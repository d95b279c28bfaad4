"""MLflow tracking against a real SQLite store and a real ``mlflow server`` on 127.0.0.1.

Runs, nesting, params, tags, metric counts, artifacts; idempotent buffering; an outage test that
stops the server mid-trial and restarts it (no step lost or duplicated); verl's own MLflow logger
writing into the child run through ``MLFLOW_RUN_ID``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import verdict_streams as V
from mlflow_server import MlflowServer

from orchestrator import metrics as M
from orchestrator.grid import expand, load_grid
from orchestrator.schema import CollapseSpec
from orchestrator.tracking import GridRun, TrialRun, client, drain, use_wal
from orchestrator.tracking._labels import THROUGH_TAG, trial_run_name
from orchestrator.tracking._store import sanitize_key
from orchestrator.trial import Attempt
from orchestrator.verdict import judge

SECRET = "s3cr3t-token-value-must-not-leak"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory):
    os.environ.setdefault("ABLATE_RECIPES", str(Path(__file__).resolve().parents[2] / "recipes"))
    grid = load_grid(Path(__file__).resolve().parents[2] / "grids" / "quickstart.yaml")
    return grid, expand(grid)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield srv
    srv.stop()


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(uri).get_metric_history(run_id, key))


def open_trial(uri: str, grid_run: GridRun, grid, trial, buf: Path, run_id: str | None = None) -> TrialRun:
    return TrialRun(uri, grid_run.experiment_id, grid_run.run_id, trial, grid.pools.get(trial.pool),
                    run_id=run_id, buffer_dir=buf)


def check_grid_in_store(uri: str, quickstart, tmp: Path, n_trials: int = 3) -> None:
    """Parent + children with params, tags, metrics and artifacts, read back from the store."""
    grid, trials = quickstart
    os.environ["ABLATE_TEST_SECRET"] = SECRET  # must never reach params or tags
    try:
        parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp / ".ablate")
        runs = {}
        for t in trials[:n_trials]:
            tr = open_trial(uri, parent, grid, t, tmp / "buf" / t.trial_id)
            tr.log(V.metric_rows(60, 12))
            tr.log_attempts([Attempt(1, t.pool, 1, 30, "infra_failure"), Attempt(2, t.pool, 31, 60, "completed",
                                                                                   resumed_from_step=30)])
            tr.set_verdict(judge(V.explosion(seed=0), CollapseSpec()))
            assert tr.end("FINISHED")
            runs[t.trial_id] = tr.run_id
        parent.end()
    finally:
        del os.environ["ABLATE_TEST_SECRET"]
    mlc = client(uri)
    exp = mlc.get_experiment_by_name(grid.name)
    assert exp is not None and exp.experiment_id == parent.experiment_id
    children = mlc.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.run_id}'")
    assert {r.data.tags["trial_id"] for r in children} == set(runs)
    for t in trials[:n_trials]:
        run = mlc.get_run(runs[t.trial_id])
        assert run.info.status == "FINISHED" and run.info.run_name == trial_run_name(t)
        assert run.data.tags["mlflow.parentRunId"] == parent.run_id
        for axis, value in t.axes:
            assert run.data.params[axis] == value
        tags = run.data.tags
        assert tags["pool"] == t.pool and tags["accelerator"] == grid.pools.get(t.pool).accelerator
        assert tags["version.mlflow"] and tags["version.torch"]
        assert tags["attempt.2.steps"] == "31-60" and tags["attempt.2.resumed_from_step"] == "30"
        assert tags["verdict"] == "collapsed" and tags["verdict.step"] == "180"
        assert tags[THROUGH_TAG] == "60"
        everything = json.dumps([run.data.params, run.data.tags])
        assert SECRET not in everything
        for key in V.metric_rows(1, 12)[0][1]:
            assert [s for s, _ in history(uri, run.info.run_id, key)] == list(range(1, 61))
        arts = {a.path for a in mlc.list_artifacts(run.info.run_id)}
        assert {"attempts.json", "verdict.json"} <= arts
        local = mlc.download_artifacts(run.info.run_id, "attempts.json", str(tmp / "dl" / t.trial_id))
        attempts = json.loads(Path(local).read_text())["attempts"]
        assert [(a["pool"], a["start_step"], a["end_step"]) for a in attempts] == [
            (t.pool, 1, 30), (t.pool, 31, 60)]
    parent_run = mlc.get_run(parent.run_id)
    assert parent_run.info.status == "FINISHED" and parent_run.data.tags["ablate.role"] == "grid"
    assert "mlflow.parentRunId" not in parent_run.data.tags


def test_sqlite_store_runs_nesting_params_tags_metrics_artifacts(quickstart, tmp_path: Path) -> None:
    check_grid_in_store(f"sqlite:///{tmp_path / 'mlflow.db'}", quickstart, tmp_path)


def test_server_runs_nesting_params_tags_metrics_artifacts(server: MlflowServer, quickstart,
                                                           tmp_path: Path) -> None:
    check_grid_in_store(server.uri, quickstart, tmp_path, n_trials=2)


def test_logging_is_idempotent_per_step(quickstart, tmp_path: Path) -> None:
    grid, trials = quickstart
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp_path)
    t = trials[0]
    tr = open_trial(uri, parent, grid, t, tmp_path / "buf")
    rows = V.metric_rows(40, 5)
    tr.log(rows[:25])
    tr.log(rows[:30])  # overlaps: steps 1..25 again, 26..30 new
    tr.log(rows[10:20])  # entirely old
    assert [s for s, _ in history(uri, tr.run_id, M.GRAD_NORM)] == list(range(1, 31))
    # The reply of a committed batch was lost: the same outbox rows are sent again.
    tr.outbox.through_step = 0
    tr.outbox.rows = [{"step": s, "ts": r["ts"], "metrics": r["metrics"]}
                      for s, r in [(x["step"], x) for x in _sent_rows(tr, rows[:30])]]
    assert tr.flush(5)
    assert len(history(uri, tr.run_id, M.GRAD_NORM)) == 30
    # The same run reopened from a fresh buffer (another machine): the store's mark says 30.
    again = open_trial(uri, parent, grid, t, tmp_path / "other-buf", run_id=tr.run_id)
    again.log(rows)
    assert again.end()
    assert [s for s, _ in history(uri, tr.run_id, M.GRAD_NORM)] == list(range(1, 41))


def _sent_rows(tr: TrialRun, rows: list) -> list[dict]:
    """Rebuild outbox rows with the timestamps the store has (what a lost reply would resend)."""
    mlc = client(tr.tracking_uri)
    stamps = {m.step: m.timestamp for m in mlc.get_metric_history(tr.run_id, M.GRAD_NORM)}
    return [{"step": s, "ts": stamps[s], "metrics": {sanitize_key(k): v for k, v in m.items()}} for s, m in rows]


def test_resume_from_earlier_checkpoint_replaces_the_run_one_value_per_step(quickstart, tmp_path: Path) -> None:
    """`ablate resume --from 30`: the runner refills a fresh run (steps 1-30 from the local file,
    then the new attempt) and ``supersede`` links and soft-deletes the old one."""
    from orchestrator.compare import load_results
    from orchestrator.tracking import supersede

    grid, trials = quickstart
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp_path)
    t = trials[1]
    tr = open_trial(uri, parent, grid, t, tmp_path / "buf")
    tr.log([(s, {M.GRAD_NORM: 1.0}) for s in range(1, 51)])
    tr.log_attempts([Attempt(1, "sim-a100", 1, 50, "completed")])
    assert tr.end()
    tr2 = open_trial(uri, parent, grid, t, tmp_path / "buf2")
    tr2.log([(s, {M.GRAD_NORM: 1.0}) for s in range(1, 31)] + [(s, {M.GRAD_NORM: 2.0}) for s in range(31, 61)])
    tr2.log_attempts([Attempt(1, "sim-a100", 1, 50, "completed"), Attempt(2, "sim-h100", 31, 60, "completed")])
    assert tr2.end()
    assert supersede(uri, tr.run_id, tr2.run_id) and supersede(uri, tr.run_id, tr2.run_id)  # idempotent
    merged = history(uri, tr2.run_id, M.GRAD_NORM)
    assert [s for s, _ in merged] == list(range(1, 61))  # no duplicate, no gap
    assert {v for s, v in merged if s <= 30} == {1.0} and {v for s, v in merged if s > 30} == {2.0}
    tags = client(uri).get_run(tr2.run_id).data.tags
    assert tags["pools"] == "sim-a100,sim-h100" and tags["pool_steps"] == "sim-a100:1-30,sim-h100:31-60"
    old = client(uri).get_run(tr.run_id)
    assert old.info.lifecycle_stage == "deleted" and old.data.tags["superseded_by"] == tr2.run_id
    (res,) = [r for r in load_results(client(uri), parent.experiment_id, ["pool"]) if r.trial_id == t.trial_id]
    assert res.run_id == tr2.run_id and [g.pool for g in res.segments] == ["sim-a100", "sim-h100"]


def test_sanitised_names_match_verl_logger() -> None:
    verl_tracking = pytest.importorskip("verl.utils.tracking")
    adapter = verl_tracking._MlflowLoggingAdapter()
    for key in ["val-core/openai/gsm8k/acc/mean@1", "actor/grad_norm", "a//b", "x(y)=z", M.K3_KL,
                M.bucket_name(0.0, 1e-3), "timing_s/update_actor"]:
        assert sanitize_key(key) == adapter._sanitize_key(key)


VERL_CHILD = """
import os, sys
from verl.utils.tracking import Tracking
tr = Tracking(project_name="ignored", experiment_name="ignored", default_backend=["mlflow"],
              config={"algorithm": {"rollout_correction": {"rollout_is": "token"}}})
for step in range(11, 21):
    tr.log({"actor/grad_norm": float(step), "val-core/gsm8k/acc/mean@1": 0.5}, step=step)
tr.finish()
"""


def test_verl_logger_attaches_to_child_run_via_mlflow_run_id(quickstart, tmp_path: Path) -> None:
    pytest.importorskip("verl.utils.tracking")
    grid, trials = quickstart
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp_path)
    tr = open_trial(uri, parent, grid, trials[0], tmp_path / "buf")
    tr.log([(s, {M.GRAD_NORM: 0.5}) for s in range(1, 11)])
    assert tr.flush(5)
    env = {**os.environ, **tr.env()}
    out = subprocess.run([sys.executable, "-c", VERL_CHILD], env=env, capture_output=True, text=True, check=False,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    tr.set_verdict(judge(V.healthy(), CollapseSpec()))
    assert tr.end()
    assert [s for s, _ in history(uri, tr.run_id, M.GRAD_NORM)] == list(range(1, 21))
    assert len(history(uri, tr.run_id, "val-core/gsm8k/acc/mean_at_1")) == 10
    run = client(uri).get_run(tr.run_id)
    assert run.data.params["algorithm/rollout_correction/rollout_is"] == "token"
    assert run.data.tags["verdict"] == "healthy" and run.info.status == "FINISHED"
    assert len(client(uri).search_runs([parent.experiment_id])) == 2  # verl made no run of its own


def test_outage_mid_trial_loses_and_duplicates_nothing(quickstart, tmp_path: Path) -> None:
    grid, trials = quickstart
    srv = MlflowServer(tmp_path / "srv").start()
    try:
        parent = GridRun.open(grid, tracking_uri=srv.uri, workdir=tmp_path)
        trial = trials[2]
        tr = open_trial(srv.uri, parent, grid, trial, tmp_path / "buf")
        rows = V.metric_rows(300, 8)
        tr.log(rows[:100])
        srv.stop()
        # A second trial starts while the server is down: its run cannot even be created yet.
        late = open_trial(srv.uri, parent, grid, trials[3], tmp_path / "buf-late")
        assert late.run_id is None
        late.log(rows[:50])
        t0 = time.monotonic()
        for i in range(100, 200, 10):  # the trial keeps training: no call may raise or hang
            tr.log(rows[i:i + 10])
        assert time.monotonic() - t0 < 30
        assert not tr.flush(timeout=1)
        assert len(tr.outbox.rows) == 100 and (tmp_path / "buf" / "pending.jsonl").stat().st_size > 0
        srv.start()
        tr.log(rows[200:])
        tr.set_verdict(judge(V.healthy(), CollapseSpec()))
        assert tr.end("FINISHED", timeout=60)
        assert late.end("KILLED", timeout=60) and late.run_id is not None
    finally:
        srv.stop()
    # Read back from the server's own SQLite store.
    store = f"sqlite:///{srv.root / 'server.db'}"
    for key in rows[0][1]:
        got = history(store, tr.run_id, sanitize_key(key))
        assert [s for s, _ in got] == list(range(1, 301)), key
        assert [v for _, v in got] == [r[key] for _, r in rows]
    assert [s for s, _ in history(store, late.run_id, sanitize_key(next(iter(rows[0][1]))))] == list(
        range(1, 51))
    late_run = client(store).get_run(late.run_id)
    assert late_run.info.status == "KILLED" and late_run.data.params["seed"] == str(trials[3].seed)
    assert late_run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert client(store).get_run(tr.run_id).data.tags["verdict"] == "healthy"


def test_drain_finishes_an_outbox_left_by_a_dead_process(quickstart, tmp_path: Path) -> None:
    grid, trials = quickstart
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp_path)
    tr = open_trial(uri, parent, grid, trials[0], tmp_path / "buf")
    tr.log([(1, {M.GRAD_NORM: 1.0})])
    # Simulate a crash after buffering but before sending: rows and the end status on disk only.
    tr.outbox.add_rows([(s, {M.GRAD_NORM: float(s)}) for s in range(2, 11)])
    tr.outbox.end_status = "FAILED"
    tr.outbox.save_state()
    assert drain(tmp_path / "buf", uri)
    assert [s for s, _ in history(uri, tr.run_id, M.GRAD_NORM)] == list(range(1, 11))
    assert client(uri).get_run(tr.run_id).info.status == "FAILED"


def test_a_trial_keeps_one_live_run_after_a_kill_in_the_creation_window(quickstart, tmp_path: Path) -> None:
    """A run the store created for a trial's outbox before a kill let ``run.json`` name it is
    adopted by the next creation from that outbox; a RUNNING run that neither the record, the
    outbox nor its creation token names is retired when a submission opens its parent run."""
    from orchestrator.store import TrialPaths, records, workspace

    grid, trials = quickstart
    t, other = trials[0], trials[1]
    work = tmp_path / ".ablate"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=work)
    paths = TrialPaths(workspace.grid_dir(grid.name, work), t.trial_id)
    records.save_spec(paths, t)
    named = open_trial(uri, parent, grid, t, tmp_path / "buf-a").run_id  # the record's run
    records.save_state(paths, records.TrialRecord(trial_id=t.trial_id, mlflow_run_id=named))
    stray = open_trial(uri, parent, grid, t, tmp_path / "buf-c").run_id  # nothing names it
    elsewhere = open_trial(uri, parent, grid, other, tmp_path / "buf-d").run_id  # no folder here
    created = open_trial(uri, parent, grid, t, paths.outbox)
    unrecorded = created.run_id
    created.outbox.run_id = None  # killed after the store created it, before run.json named it
    created.outbox.save_state()

    again = GridRun.open(grid, tracking_uri=uri, workdir=work)  # the next submission
    mlc = client(uri)
    gone = mlc.get_run(stray)
    assert (gone.info.lifecycle_stage, gone.info.status) == ("deleted", "KILLED")
    assert "no record of trial" in gone.data.tags["ablate.ended"]
    for kept in (named, unrecorded, elsewhere):
        run = mlc.get_run(kept)
        assert (run.info.lifecycle_stage, run.info.status) == ("active", "RUNNING"), kept
    assert open_trial(uri, again, grid, t, paths.outbox).run_id == unrecorded  # adopted
    live = mlc.search_runs([parent.experiment_id], filter_string=f"tags.trial_id = '{t.trial_id}'")
    assert sorted(r.info.run_id for r in live) == sorted([named, unrecorded])


def test_outage_between_chunks_keeps_only_the_unsent_rows(quickstart, tmp_path: Path, monkeypatch) -> None:
    """A catch-up send of 2400 values (3 log_batch chunks) fails on its 2nd chunk: the 1st chunk is
    dropped from the outbox (and marked in the store), the rest waits; nothing lost or doubled."""
    from mlflow import MlflowClient

    grid, trials = quickstart
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = GridRun.open(grid, tracking_uri=uri, workdir=tmp_path)
    assert use_wal(uri) == "wal"  # the embedded store commits through a write-ahead log
    tr = open_trial(uri, parent, grid, trials[0], tmp_path / "buf")
    rows = V.metric_rows(300, 8)
    real, calls = MlflowClient.log_batch, []

    def flaky(self, run_id, metrics=(), params=(), tags=(), **kw):
        calls.append(len(metrics))
        if len(calls) == 2:
            raise ConnectionError("store went away")
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    tr.log(rows)  # must not raise
    assert calls == [999, 999]
    assert tr.outbox.through_step == 124  # 999 values = steps 1..124 whole + 7 values of step 125
    assert [r["step"] for r in tr.outbox.rows] == list(range(125, 301))
    assert client(uri).get_run(tr.run_id).data.tags[THROUGH_TAG] == "124"
    monkeypatch.setattr(MlflowClient, "log_batch", real)
    assert tr.flush(timeout=10) and tr.outbox.empty()
    for key in rows[0][1]:
        got = history(uri, tr.run_id, sanitize_key(key))
        assert [s for s, _ in got] == list(range(1, 301)), key
        assert [v for _, v in got] == [r[key] for _, r in rows]


@pytest.mark.slow
def test_ui_serves_the_grid_store_on_loopback(quickstart, tmp_path: Path) -> None:
    """`ablate ui` on a store with one grid: URL printed with the experiment, server answers."""
    import re
    import signal

    import cliproc
    from mlflow_server import free_port, wait_healthy

    grid, _ = quickstart
    work = tmp_path / ".ablate"
    uri = f"sqlite:///{work / 'mlflow.db'}"
    work.mkdir()
    parent = GridRun.open(grid, tracking_uri=uri, workdir=work)
    parent.end()
    port = free_port()
    grid_file = str(Path(__file__).resolve().parents[2] / "grids" / "quickstart.yaml")
    proc = cliproc.start_piped(["ui", grid_file, "--port", str(port), "--workdir", str(work)],
                               Path(__file__).resolve().parents[2])
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert f"http://127.0.0.1:{port}/#/experiments/{parent.experiment_id}/runs?viewStateShareKey=" in line
        view = client(uri).get_experiment(parent.experiment_id).tags["mlflow.sharedViewState.ablate-trials"]
        assert "params.`correction`" in view and "tags.`verdict`" in view
        assert re.search(r"sqlite:///\S+mlflow\.db", line)
        assert wait_healthy(port)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
