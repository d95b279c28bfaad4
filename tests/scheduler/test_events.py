"""``ablate submit`` off a terminal: its stdout piped, as in a CI log or ``| tee``.

The command runs as a subprocess on the embedded local Ray: the real simulator for the text
lines (one per trial event, a summary per pool, the final summary), the deterministic double of
``tests/doubles.py`` for ``--json-events`` and ``--quiet``, where trials must fail, retry and
collapse on demand.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import cliproc
import pytest
from rayclusters import write_grid

from orchestrator.store import TrialPaths, records

TRIAL_FIELDS = {"event", "time", "grid", "trial_id", "pool", "label", "axes", "seed", "step",
                "steps", "attempt", "verdict", "reason", "reward"}
POOL_FIELDS = {"event", "time", "grid", "pool", "running", "queued", "done", "failed",
               "cancelled", "collapsed", "verdicts"}


def _double_grid(root: Path, name: str) -> None:
    # The double: `none` on sim-a100 collapses; lr 0.0666 fails every attempt; with
    # ABLATE_DOUBLE_FAIL_ONCE every other trial fails its first attempt at step 7 (one retry).
    write_grid(root / "g.yaml", name, steps=20, seeds=[0], levels=["none", "token"],
               pools=["sim-a100"], axes="  train.lr: [0.003, 0.0666]\n", keep=None, retries=1,
               tiny=False)


def _specs(root: Path, grid: str) -> dict[str, dict]:
    grid_dir = root / ".ablate" / grid
    return {tid: {"spec": records.load_spec(TrialPaths(grid_dir, tid)),
                  "state": records.load_state(TrialPaths(grid_dir, tid), tid)}
            for tid in records.trial_ids(grid_dir)}


@pytest.mark.slow
def test_piped_submit_prints_a_line_per_trial_event_and_pool_summaries(tmp_path: Path) -> None:
    write_grid(tmp_path / "g.yaml", "piped", steps=20, seeds=[0], levels=["none", "token"],
               pools=["sim-h100", "sim-a100"], keep=None, retries=None)
    with cliproc.ablate_env(tmp_path) as env:
        proc = cliproc.run(["submit", "g.yaml", "--summary-every", "1"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "┃" not in proc.stdout  # no live table off a terminal
    trials = _specs(tmp_path, "piped")
    assert len(trials) == 4
    for tid, t in trials.items():
        spec, state = t["spec"], t["state"]
        label = f"{spec.pool} [correction.is_level={spec.axis_values['correction.is_level']} seed=0]"
        mine = [(i, line) for i, line in enumerate(lines) if f" {tid} " in line]
        kinds = [line.split()[1] for _, line in mine]
        assert kinds[0] == "started" and kinds[-1] == "finished", mine
        assert kinds.count("started") == 1 and kinds.count("finished") == 1, mine
        assert all(label in line for _, line in mine), mine
        assert mine[0][1].endswith("step 0/20 attempt 1")
        for _, line in mine[1:-1]:  # checkpoints in between, at multiples of `every`
            assert re.search(r" checkpoint +\S+ .* step (5|10|15)/20$", line), line
        assert f"step 20/20 verdict={state.verdict['kind']} reward=" in mine[-1][1]
    # A per-pool summary line at least once a second while trials run, and the last one final.
    for pool in ("sim-h100", "sim-a100"):
        counts = [line for line in lines if re.match(rf"\d\d:\d\d:\d\d pool {pool}: ", line)]
        assert len(counts) >= 2, lines
        assert " running 0, queued 0, done 2 " in counts[-1], counts[-1]
    assert re.fullmatch(r"piped: 4 trials in \d+ s: done 4; verdicts: .+", lines[-1]), lines[-1]


@pytest.fixture
def double_env(tmp_path: Path):
    fail_once = tmp_path / "fail-once"
    fail_once.mkdir()
    with cliproc.ablate_env(tmp_path, {"ABLATE_DOUBLE_FAIL_ONCE": str(fail_once),
                                       "ABLATE_DOUBLE_STEP_S": "0.05"}) as env:
        yield env


@pytest.mark.slow
def test_json_events_one_object_per_line_with_stable_fields(tmp_path: Path, double_env) -> None:
    _double_grid(tmp_path, "jsonev")
    proc = cliproc.run(["submit", "g.yaml", "--json-events", "--summary-every", "1"], double_env,
                       tmp_path, double=True)
    assert proc.returncode == 1, proc.stderr[-3000:]  # two trials failed for good
    events = [json.loads(line) for line in proc.stdout.splitlines()]  # every line is JSON
    assert events[-1]["event"] == "summary"
    assert events[-1]["states"] == {"done": 2, "failed": 2} and events[-1]["grid"] == "jsonev"
    pools = [e for e in events if e["event"] == "pool"]
    assert pools and all(set(e) == POOL_FIELDS for e in pools)
    assert pools[-1] | {"time": 0} == {
        "event": "pool", "time": 0, "grid": "jsonev", "pool": "sim-a100", "running": 0,
        "queued": 0, "done": 2, "failed": 2, "cancelled": 0, "collapsed": 1,
        "verdicts": {"collapsed": 1, "healthy": 1}}
    trial_events = [e for e in events if e["event"] not in ("pool", "summary")]
    assert all(set(e) == TRIAL_FIELDS for e in trial_events)
    for tid, t in _specs(tmp_path, "jsonev").items():
        axes = t["spec"].axis_values
        mine = [e for e in trial_events if e["trial_id"] == tid and e["event"] != "checkpoint"]
        assert all(e["pool"] == "sim-a100" and e["seed"] == 0 and e["steps"] == 20
                   and e["axes"] == {"correction.is_level": axes["correction.is_level"],
                                     "train.lr": axes["train.lr"]}
                   and e["label"] == f"correction.is_level={axes['correction.is_level']} "
                                     f"train.lr={axes['train.lr']} seed=0" for e in mine)
        # Every trial fails its first attempt at step 7 and is retried once from step 5.
        assert [(e["event"], e["attempt"], e["step"]) for e in mine[:2]] == [
            ("started", 1, 0), ("retried", 2, 5)], mine
        assert "injected infra failure at step 7" in mine[1]["reason"]
        last = mine[2]
        assert len(mine) == 3
        if axes["train.lr"] == "0.0666":
            assert (last["event"], last["verdict"]) == ("failed", "infra_failure")
            assert "retries exhausted after 2 attempts" in last["reason"]
        else:
            verdict = "collapsed" if axes["correction.is_level"] == "none" else "healthy"
            assert (last["event"], last["verdict"], last["step"]) == ("finished", verdict,
                                                                      t["state"].last_step)
            assert isinstance(last["reward"], float)


@pytest.mark.slow
def test_quiet_prints_the_final_summary_and_failed_trials_only(tmp_path: Path,
                                                               double_env) -> None:
    _double_grid(tmp_path, "quiet")
    proc = cliproc.run(["submit", "g.yaml", "--quiet", "--summary-every", "1"], double_env,
                       tmp_path, double=True)
    assert proc.returncode == 1, proc.stderr[-3000:]  # two trials failed for good
    failed = sorted(tid for tid, t in _specs(tmp_path, "quiet").items()
                    if t["state"].state.value == "failed")
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"quiet: 4 trials in \d+ s: done 2, failed 2; verdicts: collapsed 1, "
                        r"healthy 1, infra_failure 2", lines[0]), lines
    assert sorted(line.split()[1].rstrip(":") for line in lines[1:]) == failed
    assert all(line.startswith("failed t") and "retries exhausted" in line for line in lines[1:])
    # The failures as they happened, on stderr (among Ray's and MLflow's own log lines).
    events = [line for line in proc.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d failed ", line)]
    assert sorted(line.split()[2] for line in events) == failed


# --------------------------------------------------------------------------- without Ray


def test_output_mode_follows_the_terminal_and_the_flags() -> None:
    from orchestrator.cli import build_parser
    from orchestrator.cli.commands import _output_mode

    def mode(*flags: str, tty: bool) -> str:
        return _output_mode(build_parser().parse_args(["submit", "g.yaml", *flags]), tty)

    assert mode(tty=True) == "live" and mode("--no-progress", tty=True) == "none"
    assert mode(tty=False) == "lines" and mode("--no-progress", tty=False) == "lines"
    for tty in (True, False):
        assert mode("--json-events", tty=tty) == "json"
        assert mode("--quiet", tty=tty) == "quiet"
        assert mode("--json", tty=tty) == "summary"


@pytest.mark.parametrize("flags", [["--json", "--quiet"], ["--json-events", "--json"],
                                   ["--quiet", "--json-events"]])
def test_output_flags_exclude_each_other(flags: list[str], capsys) -> None:
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["submit", "g.yaml", *flags])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_summary_period_must_be_positive(tmp_path: Path, capsys) -> None:
    from orchestrator.cli import main

    assert main(["submit", str(tmp_path / "g.yaml"), "--summary-every", "0"]) == 2
    assert capsys.readouterr().err == "error: --summary-every 0.0: must be > 0 seconds\n"


def _trial(grid_dir: Path, tid: str, level: str):
    from orchestrator.trial import TrialSpec

    spec = TrialSpec(trial_id=tid, grid="w", backend="sim", recipe="sim/grpo_tiny",
                     pool="sim-a100", seed=1, steps=40,
                     axes=(("correction.is_level", level), ("pool", "sim-a100")), overrides=())
    records.save_spec(TrialPaths(grid_dir, tid), spec)
    return TrialPaths(grid_dir, tid)


def _set(paths: TrialPaths, tid: str, state: str, attempts: list[tuple], **fields) -> None:
    from orchestrator.trial import Attempt, TrialState

    rec = records.load_state(paths, tid)
    rec.state, rec.attempts = TrialState(state), len(attempts)
    for key, value in fields.items():
        setattr(rec, key, value)
    records.save_state(paths, rec)
    records.save_attempts(paths, [Attempt(i + 1, "sim-a100", start, None, outcome, reason)
                                  for i, (start, outcome, reason) in enumerate(attempts)])


def test_watcher_reports_every_change_between_two_polls_in_order(tmp_path: Path) -> None:
    """From the trial files alone: a trial that starts, fails, is retried and finishes between
    two polls gets all three events; a trial first seen after the first poll (a search point)
    gets its start; the final pool summary is not repeated when nothing changed."""
    from orchestrator.scheduler import EventWatcher

    got: list = []
    a = _trial(tmp_path, "ta", "none")
    watcher = EventWatcher(tmp_path, "w", got.append, summary_every_s=3600)
    watcher.poll()
    assert got == []  # the first poll only records where the trials stand
    _set(a, "ta", "done", [(1, "infra_failure", "worker died"), (21, "completed", None)],
         last_step=40, committed_step=40, verdict={"kind": "collapsed", "reason": "grad norm"})
    b = _trial(tmp_path, "tb", "token")  # appears after the first poll
    _set(b, "tb", "running", [(1, None, None)], committed_step=10)
    watcher.poll()
    assert [(e.trial_id, e.kind.value, e.step, e.attempt) for e in got] == [
        ("ta", "started", 0, 1), ("ta", "retried", 20, 2), ("ta", "finished", 40, 2),
        ("tb", "started", 0, 1)]
    assert got[1].reason == "worker died" and got[2].verdict == "collapsed"
    assert got[0].label == "correction.is_level=none seed=1" and got[0].pool == "sim-a100"
    _set(b, "tb", "running", [(1, None, None)], committed_step=20)
    watcher.poll()
    assert [(e.kind.value, e.step) for e in got[4:]] == [("checkpoint", 20)]
    watcher.summary(unless_unchanged=True)
    watcher.summary(unless_unchanged=True)
    pools = [e.to_json() for e in got[5:]]
    assert len(pools) == 1 and pools[0] | {"time": 0} == {
        "event": "pool", "time": 0, "grid": "w", "pool": "sim-a100", "running": 1, "queued": 0,
        "done": 1, "failed": 0, "cancelled": 0, "collapsed": 1, "verdicts": {"collapsed": 1}}


def test_live_view_and_watcher_reread_only_trials_whose_state_changed(tmp_path: Path, monkeypatch) -> None:
    """Each tick of ``ablate submit`` reads only what changed: a finished trial's view is kept
    while its state.json is the same file, a rewritten one is read again."""
    from orchestrator.scheduler import EventWatcher
    from orchestrator.scheduler._progress import ViewCache, collect

    a, b = _trial(tmp_path, "ta", "none"), _trial(tmp_path, "tb", "token")
    _set(a, "ta", "done", [(1, "completed", None)], last_step=40, committed_step=40)
    _set(b, "tb", "running", [(1, None, None)], committed_step=10)
    got: list = []
    watcher, cache = EventWatcher(tmp_path, "w", got.append, summary_every_s=3600), ViewCache()
    watcher.poll()
    first = {t.trial_id: t for t in collect(tmp_path, "w", cache=cache).trials}
    reads: list[str] = []
    load = records.load_state
    monkeypatch.setattr(records, "load_state", lambda paths, tid: reads.append(tid) or load(paths, tid))
    second = {t.trial_id: t for t in collect(tmp_path, "w", cache=cache).trials}
    watcher.poll()
    assert second["ta"] is first["ta"] and reads == ["tb"]  # the running one is read each tick
    _set(a, "ta", "pending", [(1, "completed", None)])  # `ablate resume` reopened it
    reads.clear()
    third = {t.trial_id: t for t in collect(tmp_path, "w", cache=cache).trials}
    watcher.poll()
    assert third["ta"].state == "pending" and sorted(reads) == ["ta", "ta", "tb"]
