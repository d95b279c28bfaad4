"""Submit, watch, diagnose and delete trial RayJobs with the kubernetes Python client.

Status mapping (KubeRay v1.7.0 ``ray-operator/apis/ray/v1/rayjob_types.go``): a RayJob has a
``jobDeploymentStatus`` (cluster lifecycle: "", Initializing, Running, Complete, Failed,
ValidationFailed, Suspending, Suspended, Retrying, Waiting) and a ``jobStatus`` (the Ray job:
"", PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED). :func:`phase_of` folds the pair into one
:class:`Phase`, and :attr:`JobState.trial_state` into the orchestrator's ``TrialState``.
Kueue keeps a RayJob ``Suspended`` until it admits it, so "queued" is visible as such.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from orchestrator.exceptions import BackendUnavailableError, UserError
from orchestrator.k8s.settings import LABEL_PREFIX
from orchestrator.trial import TrialState

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
RETRY_SECONDS = 300.0
_nap = time.sleep
T = TypeVar("T")


class Phase(enum.Enum):
    QUEUED = "queued"  # not admitted yet (Kueue holds it suspended) or not seen by KubeRay
    STARTING = "starting"  # cluster coming up, or the Ray job not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the Ray job was stopped (not by a failure)

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED)


_TRIAL_STATE = {
    Phase.QUEUED: TrialState.PENDING,
    Phase.STARTING: TrialState.RUNNING,
    Phase.RUNNING: TrialState.RUNNING,
    Phase.SUCCEEDED: TrialState.DONE,
    Phase.FAILED: TrialState.FAILED,
    Phase.STOPPED: TrialState.CANCELLED,
}


@dataclasses.dataclass(frozen=True)
class JobState:
    phase: Phase
    job_status: str
    deployment_status: str
    reason: str = ""
    message: str = ""
    cluster: str = ""

    @property
    def trial_state(self) -> TrialState:
        return _TRIAL_STATE[self.phase]

    def describe(self) -> str:
        bits = [
            f"jobDeploymentStatus={self.deployment_status or '-'}",
            f"jobStatus={self.job_status or '-'}",
        ]
        if self.reason:
            bits.append(f"reason={self.reason}")
        if self.message:
            bits.append(f"message={' '.join(self.message.split())[:300]}")
        return ", ".join(bits)


def phase_of(status: Mapping[str, Any] | None) -> JobState:
    """Fold a RayJob ``status`` into one phase (unknown values count as still starting)."""
    status = status or {}
    js = str(status.get("jobStatus") or "")
    ds = str(status.get("jobDeploymentStatus") or "")
    extra = {
        "reason": str(status.get("reason") or ""),
        "message": str(status.get("message") or ""),
        "cluster": str(status.get("rayClusterName") or ""),
    }
    if ds in ("Failed", "ValidationFailed") or js == "FAILED":
        phase = Phase.FAILED
    elif js == "STOPPED":
        phase = Phase.STOPPED
    elif js == "SUCCEEDED" and ds in ("Complete", "Running", ""):
        phase = Phase.SUCCEEDED if ds == "Complete" else Phase.RUNNING  # wait for the cleanup
    elif ds == "Complete":
        phase = Phase.FAILED  # complete without a successful Ray job: treat as a failure
        extra["reason"] = extra["reason"] or f"deployment complete with jobStatus {js or 'unset'}"
    elif ds in ("", "Suspended", "Suspending"):
        phase = Phase.QUEUED
    elif ds == "Running" and js == "RUNNING":
        phase = Phase.RUNNING
    else:  # Initializing, Waiting, Retrying, or Running with the Ray job still PENDING
        phase = Phase.STARTING
    return JobState(phase, js, ds, **extra)


def load_config() -> None:
    """Credentials for the cluster: the in-cluster ServiceAccount, else ``$KUBECONFIG``
    (``BackendUnavailableError`` naming the fix)."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # the control RayCluster's ServiceAccount
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise BackendUnavailableError(
                "no Kubernetes credentials (no in-cluster ServiceAccount, no usable KUBECONFIG: "
                f"{exc}); fix: run in the control RayCluster or point KUBECONFIG at the cluster"
            ) from None


def _transient(exc: BaseException) -> bool:
    """Worth retrying: API server overload/restarts and broken connections, not 4xx answers."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return exc.status is None or exc.status == 429 or exc.status >= 500
    return isinstance(exc, (HTTPError, ConnectionError, TimeoutError))


def _retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """Retry transient API errors for up to RETRY_SECONDS: a trial runs for days, and one
    failed poll must not abandon (and a retry then double-submit) a running RayJob."""
    import tenacity

    return tenacity.retry(
        retry=tenacity.retry_if_exception(_transient),
        wait=tenacity.wait_exponential(multiplier=1, max=30),
        stop=tenacity.stop_after_delay(RETRY_SECONDS),
        reraise=True,
        sleep=lambda seconds: _nap(seconds),  # looked up per call, so tests can skip the wait
    )(fn)


def _refused(name: str, exc: Any) -> UserError:
    hint = {
        403: "apply k8s/base/rbac.yaml and run as ServiceAccount ablate-orchestrator",
        404: "install the KubeRay CRDs (k8s/README.md step 1) and create the namespace",
    }.get(exc.status, "inspect the manifest with `ablate submit GRID --backend k8s --dry-run`")
    body = str(exc.body or "")
    try:
        body = str(json.loads(body).get("message", body))
    except (ValueError, AttributeError):
        pass
    return UserError(
        f"the API server refused RayJob {name}: {exc.status} {exc.reason}: {body[:400]}; "
        f"fix: {hint}"
    )


class RayJobClient:
    """RayJob CRUD, status, events and log tails in one namespace.

    ``api_client`` is a ``kubernetes.client.ApiClient``; by default one is built from the
    in-cluster ServiceAccount or ``$KUBECONFIG``. Only the verbs granted by k8s/base/rbac.yaml
    are used: rayjobs create/get/delete, pods list, pods/log get, events list.
    """

    def __init__(self, namespace: str, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            load_config()
            api_client = client.ApiClient()
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create the RayJob; if it exists already (orchestrator restart) adopt it when it is
        the same trial attempt, else fail."""
        from kubernetes.client.exceptions import ApiException

        name = manifest["metadata"]["name"]
        try:
            return _retrying(self.custom.create_namespaced_custom_object)(
                GROUP, VERSION, self.namespace, PLURAL, dict(manifest)
            )
        except ApiException as exc:
            if exc.status != 409:
                if _transient(exc):
                    raise
                raise _refused(name, exc) from None
        existing = self.get(name) or {}
        want = {
            k: v for k, v in manifest["metadata"]["labels"].items() if k.startswith(LABEL_PREFIX)
        }
        have = (existing.get("metadata") or {}).get("labels") or {}
        if any(have.get(k) != v for k, v in want.items()):
            raise RuntimeError(
                f"RayJob {name} exists in {self.namespace} with other labels "
                f"({have}); delete it or check for a name clash"
            )
        return existing

    def get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return _retrying(self.custom.get_namespaced_custom_object)(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def state(self, name: str) -> JobState | None:
        obj = self.get(name)
        return None if obj is None else phase_of(obj.get("status"))

    def delete(self, name: str) -> bool:
        """Delete the RayJob and, through owner references, its cluster and pods."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            _retrying(self.custom.delete_namespaced_custom_object)(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                body=client.V1DeleteOptions(propagation_policy="Background"),
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def events(self, name: str, limit: int = 10) -> list[str]:
        """The latest Warning events about the RayJob, oldest first, as ``reason: message``."""
        got = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        warn = [e for e in got.items if (e.type or "") == "Warning"]
        warn.sort(
            key=lambda e: str(
                e.last_timestamp or e.event_time or e.metadata.creation_timestamp or ""
            )
        )
        return [f"{e.reason}: {' '.join((e.message or '').split())}" for e in warn[-limit:]]

    def log_tail(self, name: str, lines: int = 40) -> str:
        """Last lines of the job's output: the submitter pod (it follows the driver's log),
        else the head pod. Empty if no pod is left."""
        from kubernetes.client.exceptions import ApiException

        for role in ("submitter", "head"):
            pods = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=f"{LABEL_PREFIX}/rayjob={name},{LABEL_PREFIX}/role={role}",
            )
            for pod in sorted(
                pods.items, key=lambda p: str(p.metadata.creation_timestamp), reverse=True
            ):
                try:
                    text = self.core.read_namespaced_pod_log(
                        pod.metadata.name, self.namespace, tail_lines=lines
                    )
                except ApiException as exc:
                    if exc.status in (400, 404):  # container not started / pod gone
                        continue
                    raise
                if text:
                    return f"[{role} {pod.metadata.name}] {text.strip()}"
        return ""

    def failure_reason(self, name: str, state: JobState, lines: int = 40) -> str:
        """One ``infra_failure`` reason: status, warning events and the log tail."""
        parts = [f"infra_failure: RayJob {self.namespace}/{name} failed ({state.describe()})"]
        try:
            ev = self.events(name)
            if ev:
                parts.append("events: " + " | ".join(ev))
            tail = self.log_tail(name, lines)
            if tail:
                parts.append("log tail: " + tail)
        except Exception as exc:  # noqa: BLE001 - diagnosis must not hide the failure itself
            parts.append(f"(could not fetch events/logs: {type(exc).__name__}: {exc})")
        return "; ".join(parts)
