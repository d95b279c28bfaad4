"""The shared Slurm status poller (issue 38 item 7), without a cluster: N watchers of N jobs
cost one batched status call per refresh whatever N is; the refresh interval backs off while
nothing changes and returns to 1 s on a change; the client's batch is one squeue (and one
sacct for the jobs squeue no longer lists); the watcher keeps its job-state semantics."""
from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.exceptions import InfraFailure, Preempted
from orchestrator.slurm import client as sc
from orchestrator.slurm.client import JobState, SlurmClient
from orchestrator.slurm.launcher import _Follow
from orchestrator.slurm.poller import MAX_S, MIN_S, StatusPoller


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeClient:
    """``states`` answers from ``jobs`` and counts its calls (one per refresh)."""

    def __init__(self, jobs: dict[str, str]) -> None:
        self.jobs = dict(jobs)
        self.calls: list[list[str]] = []

    def states(self, ids: list[str]) -> dict[str, JobState]:
        self.calls.append(sorted(ids))
        return {j: JobState(j, self.jobs[j]) for j in ids if j in self.jobs}


def _tick(poller: StatusPoller, clock: Clock, ids: list[str], seconds: int) -> None:
    """Every watcher asks once a second for ``seconds`` seconds."""
    for _ in range(seconds):
        for j in ids:
            poller.state(j)
        clock.now += 1.0


@pytest.mark.parametrize("n", [1, 10, 500])
def test_n_watchers_cost_one_call_per_refresh(n: int) -> None:
    ids = [str(100 + i) for i in range(n)]
    client, clock = FakeClient(dict.fromkeys(ids, "PENDING")), Clock()
    poller = StatusPoller(client, clock=clock)
    _tick(poller, clock, ids, 60)
    # One call per refresh, each for every job; the same number of calls whatever n is.
    assert len(client.calls) == poller.refreshes
    assert all(call == sorted(ids) for call in client.calls[1:])
    assert len(client.calls) <= 12, len(client.calls)  # 60 s at 1, 2, 4, 8, 10, 10, ... s
    assert all(poller.state(j) == JobState(j, "PENDING") for j in ids)


def test_backoff_grows_while_unchanged_and_resets_on_change() -> None:
    client, clock = FakeClient({"1": "PENDING", "2": "PENDING"}), Clock()
    poller = StatusPoller(client, clock=clock)
    times = []
    for _ in range(40):
        before = len(client.calls)
        poller.state("1")
        poller.state("2")
        if len(client.calls) > before:
            times.append(clock.now)
        clock.now += 1.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The first answer is a change (the jobs appear); then 1, 2, 4, 8, 10, 10, ... s.
    assert gaps[:5] == [1.0, 1.0, 2.0, 4.0, 8.0] and set(gaps[5:]) == {MAX_S}, gaps
    client.jobs["2"] = "RUNNING"  # seen at the next refresh (<= MAX_S later); then 1 s again
    seen = None
    for _ in range(int(MAX_S) + 1):
        if poller.state("2").state == "RUNNING":
            seen = clock.now
            break
        clock.now += 1.0
    assert seen is not None and poller.interval == MIN_S
    calls = len(client.calls)
    clock.now += MIN_S
    poller.state("1")
    assert len(client.calls) == calls + 1  # back to one refresh a second
    # A new job resets the interval too, and joins the same single call.
    _tick(poller, clock, ["1", "2"], 30)
    assert poller.interval == MAX_S
    poller.state("3")
    clock.now += MIN_S
    poller.state("3")
    assert client.calls[-1] == ["1", "2", "3"]


def test_forgotten_and_idle_jobs_leave_the_batch() -> None:
    client, clock = FakeClient({"1": "RUNNING", "2": "RUNNING"}), Clock()
    poller = StatusPoller(client, clock=clock)
    _tick(poller, clock, ["1", "2"], 3)
    poller.forget("1")
    _tick(poller, clock, ["2"], 3)
    assert client.calls[-1] == ["2"]
    poller.state("9")  # its watcher then dies without forget
    _tick(poller, clock, ["2"], 200)
    assert poller.watched() == ["2"]


def test_a_failed_refresh_is_unknown_not_an_error() -> None:
    class Down(FakeClient):
        def states(self, ids: list[str]) -> dict[str, JobState]:
            self.calls.append(sorted(ids))
            raise sc.SlurmError("infra_failure: squeue gave no answer in 30 s")

    poller = StatusPoller(Down({}), clock=Clock())
    assert poller.state("1") is None


class Flaky(FakeClient):
    """Answers from ``jobs`` while ``up``, else as a controller that timed out."""

    up = True

    def states(self, ids: list[str]) -> dict[str, JobState]:
        if not self.up:
            self.calls.append(sorted(ids))
            raise sc.SlurmError("infra_failure: squeue gave no answer in 30 s")
        return super().states(ids)


def test_a_slow_controller_leaves_each_job_in_its_last_known_state() -> None:
    """A refresh the controller did not answer says nothing of the jobs: one seen RUNNING stays
    RUNNING through the outage (it was counted as lost after 30 s, then cancelled and started
    again as a new job), one never seen stays unknown, and the next answer replaces both."""
    client, clock = Flaky({"5": "RUNNING", "6": "PENDING"}), Clock()
    poller = StatusPoller(client, clock=clock)
    _tick(poller, clock, ["5"], 3)
    client.up = False
    _tick(poller, clock, ["5", "6"], 120)
    assert poller.state("5") == JobState("5", "RUNNING") and poller.state("6") is None
    assert len(client.calls) > 3  # it went on asking, backing off
    client.jobs["5"] = "COMPLETED"
    client.up = True
    _tick(poller, clock, ["5", "6"], 11)
    assert poller.state("5") == JobState("5", "COMPLETED")
    assert poller.state("6") == JobState("6", "PENDING")


def test_a_watcher_waits_out_a_slow_controller(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher of a RUNNING job through 200 s of a controller that gives no answer: the
    job is not called lost; it ends when its end record arrives."""
    import time

    from orchestrator.slurm import launcher
    from orchestrator.slurm.events import EventWriter

    client, clock = Flaky({"5": "RUNNING"}), Clock()
    monkeypatch.setattr(launcher, "time", SimpleNamespace(monotonic=clock, time=time.time,
                                                          sleep=time.sleep))
    poller = StatusPoller(client, clock=clock)
    writer = EventWriter(tmp_path)
    writer.write("start", job="5", node="n1", restarts=0)
    waited = []

    def sleep(seconds: float) -> None:
        clock.now += seconds
        waited.append(seconds)
        if len(waited) == 3:
            client.up = False
        if sum(waited) >= 200:
            writer.write("result", outcome="completed", last_step=2)
            writer.close()

    follow = _Follow(SimpleNamespace(), "5", tmp_path, _Ctx(tmp_path), sleep, 1.0, poller)
    result = follow.run()
    assert result.outcome.value == "completed" and result.last_step == 2
    assert sum(waited) >= 200 and not client.up


def test_client_batch_is_one_squeue_and_one_sacct(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(self: SlurmClient, argv: list[str], *, check: bool = True):
        calls.append(list(argv))
        if argv[0] == "squeue":
            out = "7|RUNNING|None|0|0|n1|\n8|FAILED|NonZeroExitCode|1|768|n2|\n"
        else:
            out = "9|COMPLETED|None|0:0|n1\n9|COMPLETED|None|0:0|n2\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(SlurmClient, "_run", run)
    monkeypatch.setattr(sc.shutil, "which", lambda exe: "/usr/bin/" + exe)
    got = SlurmClient().states(["9", "8", "7", "10"])
    assert [c[0] for c in calls] == ["squeue", "sacct"]
    assert calls[0][calls[0].index("-j") + 1] == "7,8,9,10" and "all" in calls[0]
    assert calls[1][calls[1].index("-j") + 1] == "9,10"
    assert got == {"7": JobState("7", "RUNNING", "None", 0, "0:0", "n1"),
                   "8": JobState("8", "FAILED", "NonZeroExitCode", 1, "3:0", "n2"),
                   "9": JobState("9", "COMPLETED", "None", 0, "0:0", "n2")}


class _Ctx:
    def __init__(self, log_dir: Path) -> None:
        self.resume_step, self.log_dir = 0, log_dir
        self.pool = SimpleNamespace(slurm=SimpleNamespace(partition="pa"))
        self.facts: dict = {}

    def describe_environment(self, facts: dict) -> None:
        self.facts = dict(facts)

    def should_stop(self) -> str | None:
        return None


@pytest.mark.parametrize(("state", "restarts", "error", "words"), [
    ("RUNNING", 1, InfraFailure, "requeued"),
    ("NODE_FAIL", 0, InfraFailure, "NODE_FAIL"),
    ("PREEMPTED", 0, Preempted, "PREEMPTED"),
    (None, 0, InfraFailure, "unknown to squeue"),
])
def test_watcher_through_the_poller_keeps_job_semantics(tmp_path: Path, state: str | None,
                                                       restarts: int, error: type,
                                                       words: str) -> None:
    class Jobs(FakeClient):
        def states(self, ids: list[str]) -> dict[str, JobState]:
            self.calls.append(sorted(ids))
            return {} if state is None else {j: JobState(j, state, "", restarts) for j in ids}

    clock = Clock()
    poller = StatusPoller(Jobs({}), clock=clock)
    follow = _Follow(SimpleNamespace(), "5", tmp_path, _Ctx(tmp_path), lambda s: None, 1.0, poller)
    follow.forget_s = 0.0  # "unknown" counts as lost at once here
    with pytest.raises(error) as err:
        follow.run()
    assert words in str(err.value) and "job 5" in str(err.value)


def test_requeue_seen_in_the_jobs_start_record_before_the_poller(tmp_path: Path) -> None:
    """A requeued job that restarts writes a start record with its restart count: the watcher
    fails the attempt at once, not at the poller's next refresh (up to MAX_S later)."""
    from orchestrator.slurm.events import EventWriter

    writer = EventWriter(tmp_path)
    writer.write("start", job="5", node="n1", restarts=0)
    writer.write("start", job="5", node="n1", restarts=1)
    writer.close()
    poller = StatusPoller(FakeClient({"5": "RUNNING"}), clock=Clock())
    follow = _Follow(SimpleNamespace(), "5", tmp_path, _Ctx(tmp_path), lambda s: None, 1.0, poller)
    with pytest.raises(InfraFailure) as err:
        follow.run()
    assert "requeued job 5" in str(err.value) and "start record" in str(err.value)


def test_actor_handle_recreates_a_dead_actor_then_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray actor dies with the trial worker that made it: the next call makes it again
    (get_if_exists); if that dies too, the watcher uses its own process's poller."""
    import ray
    from ray.exceptions import RayActorError

    from orchestrator.slurm import poller as pl

    made, deaths = [], [2]

    class Method:
        def __init__(self, name: str) -> None:
            self.name = name

        def remote(self, job: str) -> tuple:
            return (self.name, job)

    class Handle:
        state, forget = Method("state"), Method("forget")

    class Cls:
        def options(self, **kw):
            made.append(kw)
            return SimpleNamespace(remote=lambda conf: Handle())

    def get(ref, timeout):
        if deaths[0]:
            deaths[0] -= 1
            raise RayActorError()
        return JobState(ref[1], "PENDING")

    monkeypatch.setattr(ray, "remote", lambda **kw: lambda cls: Cls())
    monkeypatch.setattr(ray, "get", get)
    local = StatusPoller(FakeClient({"4": "RUNNING"}), clock=Clock())
    monkeypatch.setattr(pl, "local_poller", lambda client=None: local)
    handle = pl.ActorPoller()
    assert handle.state("4") == JobState("4", "RUNNING")  # two deaths: its own poller
    assert len(made) == 2 and all(kw["get_if_exists"] for kw in made)
    assert made[0]["name"].startswith(pl.ACTOR)
    deaths[0] = 1
    handle2 = pl.ActorPoller()
    assert handle2.state("4") == JobState("4", "PENDING")  # one death: made again, answered
