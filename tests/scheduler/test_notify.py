"""The grid's ``notify:`` webhooks against a loopback HTTP receiver: each event once, a slow or
dead receiver delays nothing past the bound, the URL is written nowhere, bad input at plan."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from webhooks import Receiver

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.scheduler._notify import Notifier
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.trial import TrialState

HOOK = "ABLATE_TEST_WEBHOOK"
GRID = """\
name: alerts
recipe: sim/grpo_tiny
backend: sim
steps: 12
seeds: [0, 1, 2]
pool: sim-a100
notify:
  - {{url_env: {var}, min_interval_s: 0{extra}}}
"""


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _grid(tmp: Path, var: str = HOOK, extra: str = ""):
    path = tmp / "alerts.yaml"
    path.write_text(GRID.format(var=var, extra=extra))
    return path, load_grid(path)


def _seed_records(grid) -> tuple[Path, list[str]]:
    """Three finished trials as runners leave them: one collapsed after a warning, one whose
    retries ran out, one rescued once and refused a second rescue for budget."""
    grid_dir = workspace.grid_dir(grid.name)
    trials = expand(grid)
    for t in trials:
        records.save_spec(TrialPaths(grid_dir, t.trial_id), t)
    a, b, c = (t.trial_id for t in trials)
    recs = [
        records.TrialRecord(trial_id=a, state=TrialState.DONE, pool="sim-a100", last_step=12, verdict={
            "kind": "collapsed", "step": 9, "warning_step": 6, "reason": "collapsed at step 9: k3"}),
        records.TrialRecord(trial_id=b, state=TrialState.FAILED, pool="sim-a100", last_step=7,
                            error="retries exhausted after 3 attempts: node lost",
                            verdict={"kind": "infra_failure", "step": 7, "reason": "node lost"}),
        records.TrialRecord(trial_id=c, state=TrialState.DONE, pool="sim-h20", last_step=12,
                            verdict={"kind": "healthy", "reason": "healthy"}, rescues=[
            {"event": "collapsed", "entry": 0, "by": "rescue[0]", "step": 8, "trial": c,
             "pool": "sim-h20", "start": 5},
            {"event": "collapsed", "entry": 1, "by": "rescue[1]", "step": 10, "refused": "budget",
             "error": "budget: the rescue would cost 2 h"}]),
    ]
    for rec in recs:
        records.save_state(TrialPaths(grid_dir, rec.trial_id), rec)
    return grid_dir, [a, b, c]


def test_each_event_reaches_the_receiver_once_and_the_url_is_written_nowhere(
        isolated: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOOK, receiver.url)
    _, grid = _grid(isolated)
    grid_dir, (a, b, c) = _seed_records(grid)
    n = Notifier(grid, grid_dir)
    for _ in range(2):
        n.scan()
        n.send_due()
    n.queue("grid_done", {"reason": "done 3"}, "grid_done:s1")
    n.send_due()
    again = Notifier(grid, grid_dir)  # a re-submission: the outbox remembers
    again.scan()
    again.queue("grid_done", {"reason": "done 3"}, "grid_done:s1")
    again.send_due()
    got = sorted((body["event"], body.get("trial_id")) for body in receiver.bodies)
    # c's verdict was cleared by its rescue in place: its collapse is read from the rescue note.
    assert got == sorted([("collapsed", a), ("warning", a), ("infra_failed", b), ("collapsed", c),
                          ("rescued", c), ("budget_exhausted", c), ("grid_done", None)])
    collapsed = next(x for x in receiver.bodies if x["event"] == "collapsed")
    assert collapsed["text"] == f"[alerts] collapsed: trial {a} (sim-a100) on sim-a100 at step 9: collapsed at step 9: k3"
    assert (collapsed["grid"], collapsed["pool"], collapsed["verdict"], collapsed["step"]) == (
        "alerts", "sim-a100", "collapsed", 9)
    rescued = next(x for x in receiver.bodies if x["event"] == "rescued")
    assert rescued["rescue"] == {"event": "collapsed", "by": "rescue[0]", "trial": c, "pool": "sim-h20",
                                 "start": 5}
    for f in isolated.rglob("*"):
        if f.is_file():
            assert "T0KEN-secret" not in f.read_bytes().decode("latin-1"), f


@pytest.mark.parametrize("kind", ["slow", "dead"])
def test_a_slow_or_dead_receiver_delays_nothing_past_the_bound(
        isolated: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    slow = Receiver(delay=3.0) if kind == "slow" else None
    if slow is None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}/hooks/T0KEN-secret"
    else:
        url = slow.url
    monkeypatch.setenv(HOOK, url)
    try:
        _, grid = _grid(isolated, extra=", timeout_s: 2")
        grid_dir, _ = _seed_records(grid)
        n = Notifier(grid, grid_dir)
        n.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        n.close(drain_s=0.5)
        assert time.monotonic() - t0 < 1.2  # close waits drain_s (+0.5 join slack) at most
        if kind == "dead":
            n._thread.join(3)
            items = [json.loads(p.read_text()) for p in (grid_dir / "notify").glob("*.json")]
            tried = [i for i in items if i["tries"]]
            assert tried and all(i["state"] == "pending" and "T0KEN" not in i["error"] for i in tried)
    finally:
        if slow is not None:
            slow.close()


def test_bad_webhook_variables_are_refused_at_plan(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _grid(isolated)
    monkeypatch.delenv(HOOK, raising=False)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {path}:8: notify[0].url_env: environment variable {HOOK} is not set; "
                   f"fix: export {HOOK} with the webhook's URL before running the grid")
    monkeypatch.setenv(HOOK, "ftp://example.org/T0KEN-secret")
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not hold an http(s) URL" in err and "T0KEN" not in err
    assert not (isolated / ".ablate").exists()


def test_notify_test_sends_one_event(isolated: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(HOOK, receiver.url)
    path, _ = _grid(isolated)
    assert main(["notify-test", str(path)]) == 0
    assert capsys.readouterr().out == f"notify[0] ({HOOK}): delivered\n"
    (body,) = receiver.bodies
    assert body["event"] == "test" and body["text"].startswith("[alerts] rl-ablate notify-test")


PROMPT_GRID = """\
name: prompt
recipe: sim/grpo_tiny
backend: sim
steps: 16
seeds: [0]
pool: sim-h20
overrides: {correction.is_level: token}
collapse:
  early_warning: {window: 1, lag: 1, ratio: 1.2, floor: 1.5e-4, patience: 2}
early_stop: false
notify: [{url_env: ABLATE_TEST_WEBHOOK, min_interval_s: 0}]
"""


def test_a_warning_is_sent_while_its_trial_runs(isolated: Path, receiver: Receiver,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab hears of a warning nobody acts on when it fires, not when the trial ends: the test
    double's k3 (2e-4, 3e-4, 4e-4 at steps 1-3) rises past this early warning at step 2 (held
    two steps, so known at step 3) of a 16-step trial of 0.4 s a step; the alert arrives while
    the trial runs, once, with the step and rule, and the trial's verdict at its end does not
    send it again."""
    import doubles

    from orchestrator.run import make_job, run_attempt
    from orchestrator.tracking import parent_run

    doubles.register(monkeypatch)
    monkeypatch.setenv("ABLATE_DOUBLE_SLOW_POOL", "sim-h20:0.4")
    monkeypatch.setenv(HOOK, receiver.url)
    path = isolated / "prompt.yaml"
    path.write_text(PROMPT_GRID)
    grid = load_grid(path)
    (trial,) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    n = Notifier(grid, grid_dir)
    n.start()
    try:
        with parent_run(grid, tracking_uri=workspace.tracking_uri(None, None),
                        workdir=workspace.workdir(None)) as target:
            run_attempt(make_job(grid, trial, grid_dir=grid_dir, tracking=target, submission="t"))
    finally:
        n.close(drain_s=3.0)
    paths = TrialPaths(grid_dir, trial.trial_id)
    (attempt,) = records.load_attempts(paths)
    rec = records.load_state(paths, trial.trial_id)
    assert rec.verdict["warning_step"] == 2 and attempt.end_step == 16
    again = Notifier(grid, grid_dir)  # the trial has ended: its verdict holds the warning too
    again.scan()
    again.send_due()
    (warning,) = [b for b in receiver.bodies if b["event"] == "warning"]
    (sent_at,) = [t for t, b in zip(receiver.times, receiver.bodies) if b["event"] == "warning"]
    assert sent_at < attempt.ended_at - 2.0, (sent_at, attempt.started_at, attempt.ended_at)
    assert (warning["trial_id"], warning["step"], warning["rule"], warning["verdict"]) == (
        trial.trial_id, 2, "early_warning", "running")
    assert warning["text"].startswith(f"[prompt] warning: trial {trial.trial_id} (sim-h20) on "
                                      "sim-h20 at step 2: mismatch early warning at step 2")
