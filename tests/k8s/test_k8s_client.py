"""The client and the backend against the kubernetes client's own ApiClient serialisation, with
only the HTTP layer (``ApiClient.rest_client``) replaced by an in-memory API server."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from k8shelpers import GPU_GRIDS, loaded, settings

from orchestrator.backends.base import AttemptOutcome
from orchestrator.exceptions import InfraFailure
from orchestrator.k8s.client import Phase, RayJobClient, phase_of
from orchestrator.trial import TrialState
from orchestrator.verl.trainer import VerlTrainer

NS = "ablate"


class _Resp:
    def __init__(self, status: int, body: Any, ctype: str = "application/json") -> None:
        self.status, self.reason = status, "OK" if status < 300 else "Error"
        self.data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.headers = {"content-type": ctype}

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)


class FakeApiServer:
    """Routes the requests the client makes; records each (method, path, query, body)."""

    def __init__(self) -> None:
        self.rayjobs: dict[str, dict] = {}
        self.statuses: list[dict] = []  # status returned by successive GETs (last one sticks)
        self.events: list[dict] = []
        self.pods: list[dict] = []
        self.logs: dict[str, tuple[int, str]] = {}
        self.calls: list[tuple[str, str, dict, Any]] = []

    def request(
        self,
        method: str,
        url: str,
        headers: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> _Resp:
        u = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(u.query))
        self.calls.append((method, u.path, query, body))
        rj = re.fullmatch(rf"/apis/ray.io/v1/namespaces/{NS}/rayjobs(?:/([^/]+))?", u.path)
        if rj:
            return self._rayjob(method, rj.group(1), body)
        if u.path == f"/api/v1/namespaces/{NS}/events" and method == "GET":
            return _Resp(200, {"kind": "EventList", "apiVersion": "v1", "items": self.events})
        if u.path == f"/api/v1/namespaces/{NS}/pods" and method == "GET":
            want = dict(s.split("=") for s in query["labelSelector"].split(","))
            items = [p for p in self.pods if want.items() <= p["metadata"]["labels"].items()]
            return _Resp(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
        log = re.fullmatch(rf"/api/v1/namespaces/{NS}/pods/([^/]+)/log", u.path)
        if log and method == "GET":
            code, text = self.logs.get(log.group(1), (404, "not found"))
            return _Resp(code, text, "text/plain")
        return _Resp(404, {"kind": "Status", "code": 404})

    def _rayjob(self, method: str, name: str | None, body: Any) -> _Resp:
        if method == "POST":
            n = body["metadata"]["name"]
            if n in self.rayjobs:
                return _Resp(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
            self.rayjobs[n] = json.loads(json.dumps(body))
            return _Resp(201, self.rayjobs[n])
        if name not in self.rayjobs:
            return _Resp(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        if method == "GET":
            if self.statuses:
                self.rayjobs[name]["status"] = (
                    self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
                )
            return _Resp(200, self.rayjobs[name])
        if method == "DELETE":
            del self.rayjobs[name]
            return _Resp(200, {"kind": "Status", "status": "Success"})
        return _Resp(405, {"kind": "Status", "code": 405})


def _verb(method: str, path: str) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) the API server authorizes a request as."""
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2 :]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verbs = {"POST": "create", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}
    verb = verbs.get(method) or ("get" if len(rest) > 1 else "list")
    return group, resource, verb


@pytest.fixture
def server() -> Any:
    """The fake API server; afterwards, every request it saw must be allowed by the Role."""
    from k8shelpers import REPO
    from kustomize import build

    fake = FakeApiServer()
    yield fake
    (role,) = [o for o in build(REPO / "k8s/base") if o["kind"] == "Role"]
    allowed = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for method, path, _, _ in fake.calls:
        assert _verb(method, path) in allowed, f"{method} {path} is not granted by the Role"


@pytest.fixture
def client(server: FakeApiServer) -> RayJobClient:
    from kubernetes import client as k

    api = k.ApiClient(k.Configuration(host="https://k8s.test"))
    api.rest_client = server  # the only thing replaced: the HTTP transport
    return RayJobClient(NS, api_client=api)


def _job() -> tuple[Any, dict]:
    from k8shelpers import rendered

    return rendered(GPU_GRIDS[0])[0]


# --------------------------------------------------------------------------- status mapping


@pytest.mark.parametrize(
    "ds,js,phase,state",
    [
        ("", "", Phase.QUEUED, TrialState.PENDING),
        ("Suspended", "", Phase.QUEUED, TrialState.PENDING),  # Kueue has not admitted it
        ("Suspending", "", Phase.QUEUED, TrialState.PENDING),
        ("Initializing", "", Phase.STARTING, TrialState.RUNNING),
        ("Running", "PENDING", Phase.STARTING, TrialState.RUNNING),
        ("Retrying", "FAILED", Phase.FAILED, TrialState.FAILED),
        ("Running", "RUNNING", Phase.RUNNING, TrialState.RUNNING),
        ("Running", "SUCCEEDED", Phase.RUNNING, TrialState.RUNNING),  # until the cleanup ends it
        ("Complete", "SUCCEEDED", Phase.SUCCEEDED, TrialState.DONE),
        ("Complete", "STOPPED", Phase.STOPPED, TrialState.CANCELLED),
        ("Complete", "", Phase.FAILED, TrialState.FAILED),
        ("Failed", "RUNNING", Phase.FAILED, TrialState.FAILED),
        ("ValidationFailed", "", Phase.FAILED, TrialState.FAILED),
        ("Waiting", "", Phase.STARTING, TrialState.RUNNING),
    ],
)
def test_status_maps_to_phase_and_trial_state(
    ds: str, js: str, phase: Phase, state: TrialState
) -> None:
    got = phase_of({"jobDeploymentStatus": ds, "jobStatus": js})
    assert (got.phase, got.trial_state) == (phase, state)


# --------------------------------------------------------------------------- client calls


def test_create_sends_the_manifest_to_the_rayjob_collection(client, server) -> None:
    _, job = _job()
    client.create(job)
    ((method, path, _, body),) = server.calls
    assert (method, path) == ("POST", f"/apis/ray.io/v1/namespaces/{NS}/rayjobs")
    assert body == json.loads(json.dumps(job))  # sent unchanged, as JSON
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "ablate-trials"


def test_create_adopts_the_same_attempt_and_refuses_a_clash(client, server) -> None:
    _, job = _job()
    client.create(job)
    client.create(job)  # orchestrator restarted: same trial attempt, adopted
    assert [c[0] for c in server.calls] == ["POST", "POST", "GET"]
    other = json.loads(json.dumps(job))
    server.rayjobs[job["metadata"]["name"]]["metadata"]["labels"]["ablate.io/trial"] = (
        "tffffffffffff"
    )
    with pytest.raises(RuntimeError, match="other labels"):
        client.create(other)


def test_delete_propagates_and_tolerates_absence(client, server) -> None:
    _, job = _job()
    client.create(job)
    assert client.delete(job["metadata"]["name"]) is True
    method, path, _, body = server.calls[-1]
    assert (method, path) == (
        "DELETE",
        f"/apis/ray.io/v1/namespaces/{NS}/rayjobs/{job['metadata']['name']}",
    )
    assert body["propagationPolicy"] == "Background"
    assert client.delete(job["metadata"]["name"]) is False
    assert client.state(job["metadata"]["name"]) is None


def _pod(name: str, role: str, rj: str, created: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "creationTimestamp": created,
            "labels": {"ablate.io/rayjob": rj, "ablate.io/role": role},
        }
    }


def _event(name: str, about: str, kind: str, reason: str, message: str, at: str) -> dict:
    return {"metadata": {"name": name}, "involvedObject": {"name": about}, "type": kind,
            "reason": reason, "message": message, "lastTimestamp": at}


def test_failure_reason_has_status_warnings_and_log_tail(client, server) -> None:
    _, job = _job()
    name = job["metadata"]["name"]
    client.create(job)
    server.events = [
        _event("e1", name, "Normal", "Created", "created cluster", "2026-01-01T00:00:00Z"),
        _event("e3", name, "Warning", "BackOff", "restarting\nfailed container",
               "2026-01-01T00:02:00Z"),
        _event("e2", name, "Warning", "FailedScheduling", "0/3 nodes", "2026-01-01T00:01:00Z"),
    ]
    server.pods = [
        _pod("sub-old", "submitter", name, "2026-01-01T00:00:00Z"),
        _pod("sub-new", "submitter", name, "2026-01-01T00:05:00Z"),
        _pod("head-1", "head", name, "2026-01-01T00:00:00Z"),
    ]
    server.logs = {
        "sub-new": (400, "container not started"),
        "sub-old": (200, "step:3\nCUDA error: out of memory\n"),
        "head-1": (200, "head log"),
    }
    state = phase_of(
        {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 1",
        }
    )
    reason = client.failure_reason(name, state)
    assert reason.startswith(
        f"infra_failure: RayJob {NS}/{name} failed (jobDeploymentStatus=Failed"
    )
    assert "reason=AppFailed" in reason
    assert "events: FailedScheduling: 0/3 nodes | BackOff: restarting failed container" in reason
    assert "log tail: [submitter sub-old] step:3\nCUDA error: out of memory" in reason
    ev = next(c for c in server.calls if c[1].endswith("/events"))
    assert ev[2] == {"fieldSelector": f"involvedObject.name={name}"}
    logs = [c for c in server.calls if c[1].endswith("/log")]
    assert [c[2] for c in logs] == [{"tailLines": "40"}, {"tailLines": "40"}]


def test_log_tail_falls_back_to_the_head(client, server) -> None:
    server.pods = [_pod("head-1", "head", "rj", "2026-01-01T00:00:00Z")]
    server.logs = {"head-1": (200, "Traceback: boom")}
    assert client.log_tail("rj") == "[head head-1] Traceback: boom"
    server.pods = []
    assert client.log_tail("rj") == ""


# --------------------------------------------------------------------------- backend run


class Ctx:
    """A RunContext double recording what the backend reports."""

    def __init__(
        self,
        trial: Any,
        pool: Any,
        tmp: Path,
        *,
        stop_at: int | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.trial, self.pool, self.attempt = trial, pool, 1 if resume_step is None else 2
        self.workdir = tmp / "scratch"
        self.checkpoint_every = 25
        self.resume_step = resume_step
        self.mlflow_run_id = "runabc123"
        self.logged: list[tuple[int, dict]] = []
        self.saved: dict[int, Path] = {}
        self.store = tmp / "store"
        self.polls = 0
        self.stop_at = stop_at

    def log_metrics(self, step: int, metrics: dict) -> None:
        assert not self.logged or step > self.logged[-1][0]
        self.logged.append((step, dict(metrics)))

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        assert self.logged and step <= self.logged[-1][0], "checkpoint before its metrics"
        d = self.store / f"step-{step:08d}"
        d.mkdir(parents=True)
        write(d)
        self.saved[step] = d

    def checkpoint_path(self, step: int) -> Path:
        return self.store / f"step-{step:08d}"

    def should_stop(self) -> str | None:
        self.polls += 1
        return (
            "early stop: collapsed at step 2"
            if self.stop_at and self.polls >= self.stop_at
            else None
        )


def _backend(
    server: FakeApiServer, client: RayJobClient, tmp: Path, script: list[Callable[[], None]]
):
    """K8sLauncher whose sleep advances a scripted job (writes metric lines, saves, statuses)."""
    from orchestrator.k8s.launcher import K8sLauncher

    steps = iter(script)
    (tmp / "vol").mkdir(exist_ok=True)  # the mounted checkpoint volume
    s = settings(checkpoint_root=str(tmp / "vol"))
    return K8sLauncher(settings=s, client=client, sleep=lambda _: next(steps, lambda: None)()), s


def _write(path: str, *lines: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        fh.writelines(json.dumps(rec) + "\n" for rec in lines)


def _save(ckpt: str, step: int) -> None:
    Path(ckpt, f"global_step_{step}", "actor").mkdir(parents=True, exist_ok=True)
    Path(ckpt, f"global_step_{step}", "actor", "model_world_size_8_rank_0.pt").write_text(
        str(step)
    )
    Path(ckpt, "latest_checkpointed_iteration.txt").write_text(str(step))


def test_run_streams_metrics_registers_checkpoints_and_completes(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = dataclasses.replace(trials[0], steps=3)
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path)
    server.statuses = [{"jobDeploymentStatus": "Suspended"}]
    backend, s = None, None

    def admitted() -> None:
        server.statuses = [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}]
        _write(
            s.metrics_path(trial.grid, trial.trial_id, 1),
            {"step": 1, "data": {"critic/score/mean": 0.1}},
        )

    def more() -> None:
        _write(
            s.metrics_path(trial.grid, trial.trial_id, 1),
            {"step": 2, "data": {"critic/score/mean": 0.2}},
        )
        _save(s.checkpoint_dir(trial.grid, trial.trial_id), 2)
        _save(s.checkpoint_dir(trial.grid, trial.trial_id), 3)  # ahead of the metrics: wait

    def done() -> None:
        _write(
            s.metrics_path(trial.grid, trial.trial_id, 1),
            {"step": 3, "data": {"critic/score/mean": 0.3}},
        )
        server.statuses = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]

    backend, s = _backend(server, client, tmp_path, [admitted, more, done])
    result = backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    assert result.outcome is AttemptOutcome.COMPLETED and result.last_step == 3
    assert [st for st, _ in ctx.logged] == [1, 2, 3]
    assert sorted(ctx.saved) == [3]  # step 2's save was overtaken by 3 before it was polled
    shard = ctx.saved[3] / "actor" / "model_world_size_8_rank_0.pt"
    src = Path(
        s.checkpoint_dir(trial.grid, trial.trial_id),
        "global_step_3",
        "actor",
        "model_world_size_8_rank_0.pt",
    )
    assert shard.read_text() == "3" and shard.stat().st_ino == src.stat().st_ino  # hard link
    (job,) = server.rayjobs.values()
    env = {
        e["name"]: e.get("value")
        for e in job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert env["MLFLOW_RUN_ID"] == "runabc123"
    assert "trainer.save_freq=25" in shlex.split(job["spec"]["entrypoint"])


def test_run_that_ends_early_is_an_infra_failure(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[0]  # 800 steps
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path)
    backend, s = _backend(server, client, tmp_path, [])
    _write(s.metrics_path(trial.grid, trial.trial_id, 1), {"step": 1, "data": {"x": 1}})
    server.statuses = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
    with pytest.raises(InfraFailure, match="succeeded after step 1 of 800"):
        backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)


def test_run_needs_the_checkpoint_volume(server, client, tmp_path) -> None:
    from orchestrator.exceptions import BackendUnavailableError
    from orchestrator.k8s.launcher import K8sLauncher

    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[0]
    backend = K8sLauncher(
        settings=settings(checkpoint_root=str(tmp_path / "absent")), client=client
    )
    with pytest.raises(BackendUnavailableError, match="not mounted"):
        backend.run(
            VerlTrainer(), trial, grid.trial_config(trial), Ctx(trial, grid.pools.pools[trial.pool], tmp_path)
        )
    assert server.calls == []  # nothing submitted


def test_run_stops_by_deleting_the_rayjob(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[1]
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path, stop_at=2)
    server.statuses = [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}]
    backend, _ = _backend(server, client, tmp_path, [])
    result = backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    assert result.outcome is AttemptOutcome.STOPPED and "collapsed" in (result.reason or "")
    assert server.calls[-1][0] == "DELETE" and server.rayjobs == {}


class StopAfter(Ctx):
    """Asks to stop once step ``after`` is logged, as an early-stop verdict at that step does."""

    def __init__(self, *args: Any, after: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.after = after

    def should_stop(self) -> str | None:
        done = self.logged and self.logged[-1][0] >= self.after
        return f"early stop: collapsed at step {self.after}" if done else None


def test_steps_the_job_ran_past_a_stop_are_not_recorded(server, client, tmp_path) -> None:
    """The RayJob ran ahead of the watch (here: to its end before the first poll); the attempt
    ends where an in-process trainer would have: at the step the stop was decided on, and no
    checkpoint of a later step is taken."""
    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[1]
    ctx = StopAfter(trial, grid.pools.pools[trial.pool], tmp_path, after=2)
    backend, s = _backend(server, client, tmp_path, [])
    _write(s.metrics_path(trial.grid, trial.trial_id, 1),
           *({"step": k, "data": {"x": k}} for k in range(1, 5)))
    ckpt = s.checkpoint_dir(trial.grid, trial.trial_id)
    for step in (2, 4):
        _save(ckpt, step)
    server.statuses = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
    result = backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    assert (result.outcome, result.last_step) == (AttemptOutcome.STOPPED, 2), result
    assert [step for step, _ in ctx.logged] == [1, 2]
    assert list(ctx.saved) == []  # verl's newest checkpoint (4) is past the stop: not taken


def test_run_failure_raises_infra_failure_with_log_tail(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[2]
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path)
    backend, _ = _backend(server, client, tmp_path, [])
    from orchestrator.k8s.names import rayjob_name

    name = rayjob_name(trial.grid, trial.trial_id, 1)
    server.statuses = [
        {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"}
    ]
    server.pods = [_pod("s1", "submitter", name, "2026-01-01T00:00:00Z")]
    server.logs = {"s1": (200, "torch.OutOfMemoryError: CUDA out of memory")}
    with pytest.raises(InfraFailure) as exc:
        backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    msg = str(exc.value)
    assert msg.startswith("infra_failure:") and "AppFailed" in msg and "CUDA out of memory" in msg


def test_resume_lays_out_the_checkpoint_and_skips_replayed_steps(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = dataclasses.replace(trials[3], steps=26)
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path, resume_step=25)
    stored = ctx.checkpoint_path(25) / "actor"
    stored.mkdir(parents=True)
    (stored / "model_world_size_8_rank_0.pt").write_text("weights@25")
    backend, s = _backend(server, client, tmp_path, [])
    _write(
        s.metrics_path(trial.grid, trial.trial_id, 2),
        {"step": 25, "data": {"x": 1}},
        {"step": 26, "data": {"x": 2}},
    )
    server.statuses = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
    result = backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    assert [st for st, _ in ctx.logged] == [26] and result.last_step == 26
    target = f"{s.checkpoint_dir(trial.grid, trial.trial_id)}/global_step_25"
    assert Path(target, "actor", "model_world_size_8_rank_0.pt").read_text() == "weights@25"
    (job,) = server.rayjobs.values()
    argv = shlex.split(job["spec"]["entrypoint"])
    assert (
        f"trainer.resume_from_path='{target}'" in argv
        and "trainer.resume_mode='resume_path'" in argv
    )
    assert job["metadata"]["labels"]["ablate.io/attempt"] == "2"


def test_backend_is_registered_and_delegates_check() -> None:
    """Grid backend k8s is verl launched as RayJobs: verl's checks, verl's trial ids."""
    from doubles import config_of, refusal

    from orchestrator.backends import backend
    from orchestrator.corrections import CorrectionSpec
    from orchestrator.engine import RolloutSpec
    from orchestrator.k8s.launcher import K8sLauncher
    from orchestrator.pools import load_catalog

    k8s = backend("k8s")
    pools = load_catalog().pools
    assert k8s.launcher is K8sLauncher and k8s.trainer(pools["h100"]) is VerlTrainer
    assert (K8sLauncher.name, k8s.pool_kinds, k8s.identity()) == (
        "k8s",
        ("gpu",),
        {"backend": "verl", "backend_version": VerlTrainer.version},
    )
    for corr, roll, pool in [
        (CorrectionSpec(), RolloutSpec(), pools["h100"]),
        (CorrectionSpec(), RolloutSpec(kv_cache_dtype="fp8"), pools["a100"]),
    ]:
        config = config_of(pool, corr, roll)
        assert refusal(k8s, config) == refusal(VerlTrainer, config)
    assert refusal(k8s, config_of(pools["a100"], CorrectionSpec(), RolloutSpec(kv_cache_dtype="fp8")))


def test_transient_api_errors_are_retried(server, client, monkeypatch) -> None:
    """One 503 from an API server restart must not abandon a running trial."""
    import orchestrator.k8s.client as kc

    naps: list[float] = []
    monkeypatch.setattr(kc, "_nap", naps.append)
    _, job = _job()
    client.create(job)
    real = server.request
    failures = iter([True, True])

    def flaky(method, url, **kw):
        if method == "GET" and next(failures, False):
            return _Resp(503, {"kind": "Status", "code": 503})
        return real(method, url, **kw)

    server.request = flaky
    server.statuses = [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}]
    assert client.state(job["metadata"]["name"]).phase is Phase.RUNNING
    assert len(naps) == 2  # two backoffs, then the answer


def test_refused_create_is_a_one_line_user_error(server, client) -> None:
    from orchestrator.exceptions import UserError

    def forbidden(method, url, **kw):
        body = {
            "kind": "Status",
            "code": 403,
            "message": "rayjobs.ray.io is forbidden: User "
            '"system:serviceaccount:ablate:default" cannot create resource "rayjobs"',
        }
        return _Resp(403, body)

    server.request = forbidden
    _, job = _job()
    with pytest.raises(UserError) as exc:
        client.create(job)
    msg = str(exc.value)
    assert "403" in msg and "cannot create resource" in msg and "rbac.yaml" in msg
    assert "\n" not in msg


def test_an_error_while_watching_deletes_the_rayjob(server, client, tmp_path) -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    trial = trials[4]
    ctx = Ctx(trial, grid.pools.pools[trial.pool], tmp_path)
    backend, _ = _backend(server, client, tmp_path, [])
    server.statuses = [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}]

    def broken() -> None:
        raise KeyboardInterrupt  # e.g. Ray Tune stopping the trial actor

    backend._sleep = lambda _s: broken()
    with pytest.raises(KeyboardInterrupt):
        backend.run(VerlTrainer(), trial, grid.trial_config(trial), ctx)
    assert server.calls[-1][0] == "DELETE" and server.rayjobs == {}
