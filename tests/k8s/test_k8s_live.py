"""Live tests against the cluster in KUBECONFIG (``pytest -m k8s``): KubeRay and Kueue must be
installed, and one node labelled ``ablate.io/dummy-pool=cpu-a`` (k8s/README.md: kind works).

Each test uses a throw-away namespace (restricted Pod Security), its own Kueue flavor and
queues, and a CPU-only dummy pool; the "verl job" is a tiny Python command in the Ray image, so
what is exercised is ours: the rendered RayJob, Kueue admission on the pinned flavor, the
client's status mapping, log tail on failure and delete on cancel.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.k8s

RAY_IMAGE = os.environ.get("ABLATE_LIVE_RAY_IMAGE", "rayproject/ray:2.49.2")
DUMMY_LABELS = {"ablate.io/dummy-pool": "cpu-a"}
TIMEOUT = float(os.environ.get("ABLATE_LIVE_TIMEOUT", "600"))


class PythonJob:
    """Job builder double: a short Python program instead of verl (same interface)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def command(
        self,
        trial: Any,
        config: Any,
        pool: Any,
        *,
        checkpoint_dir: str,
        resume_path: str | None = None,
    ) -> list[str]:
        return ["python", "-c", self.code]

    def environment(self, trial: Any, **kw: Any) -> dict[str, str]:
        return {"ABLATE_TRIAL_ID": trial.trial_id}


@pytest.fixture(scope="module")
def cluster() -> Any:
    kubernetes = pytest.importorskip("kubernetes")
    try:
        kubernetes.config.load_kube_config()
        api = kubernetes.client.ApiClient()
        kubernetes.client.VersionApi(api).get_code()
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable cluster here
        pytest.skip(f"no reachable cluster in KUBECONFIG ({type(exc).__name__})")
    ns = f"ablate-live-{uuid.uuid4().hex[:6]}"
    k = kubernetes.client
    core, custom = k.CoreV1Api(api), k.CustomObjectsApi(api)
    core.create_namespace(
        k.V1Namespace(
            metadata=k.V1ObjectMeta(
                name=ns, labels={"pod-security.kubernetes.io/enforce": "restricted"}
            )
        )
    )
    core.create_namespaced_service_account(
        ns,
        k.V1ServiceAccount(
            metadata=k.V1ObjectMeta(name="ablate-trial"), automount_service_account_token=False
        ),
    )
    core.create_namespaced_persistent_volume_claim(
        ns,
        k.V1PersistentVolumeClaim(
            metadata=k.V1ObjectMeta(name="ablate-checkpoints"),
            spec=k.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteOnce"],
                resources=k.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    kq = ("kueue.x-k8s.io", "v1beta2")
    custom.create_cluster_custom_object(
        *kq,
        "resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": ns},
            "spec": {"nodeLabels": DUMMY_LABELS},
        },
    )
    custom.create_cluster_custom_object(
        *kq,
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": ns},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "flavorFungibility": {
                    "whenCanBorrow": "MayStopSearch",
                    "whenCanPreempt": "MayStopSearch",
                },
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": ns,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "8"},
                                    {"name": "memory", "nominalQuota": "16Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    custom.create_namespaced_custom_object(
        *kq,
        ns,
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "ablate-trials", "namespace": ns},
            "spec": {"clusterQueue": ns},
        },
    )
    yield api, ns
    core.delete_namespace(ns)
    for plural in ("clusterqueues", "resourceflavors"):
        try:
            custom.delete_cluster_custom_object(*kq, plural, ns)
        except kubernetes.client.exceptions.ApiException as exc:  # best-effort cleanup
            print(f"cleanup of {plural}/{ns} failed: {exc.status}")


def _render(ns: str, code: str, trial_suffix: str) -> dict:
    from orchestrator.k8s.render import render_rayjob
    from orchestrator.k8s.settings import ClusterSettings
    from orchestrator.pools import PoolSpec, Toleration
    from orchestrator.trial import TrialSpec

    pool = PoolSpec(
        name="cpu-a",
        kind="gpu",
        accelerator="none",
        node_labels=DUMMY_LABELS,
        gpus_per_node=1,
        cpus_per_node=1,
        memory_per_node="2Gi",
        image=RAY_IMAGE,
        tolerations=(Toleration(key="ablate.io/dummy", operator="Exists"),),
    )
    trial = TrialSpec(
        trial_id=f"tlive{trial_suffix}",
        grid="live",
        backend="k8s",
        recipe="none",
        pool="cpu-a",
        seed=0,
        steps=1,
        axes=(("pool", "cpu-a"),),
        overrides=(),
    )
    s = ClusterSettings(
        namespace=ns,
        gpu_resource=None,
        head_cpu="500m",
        head_memory="1Gi",
        shm_size="256Mi",
        ttl_seconds_after_finished=60,
    )
    return render_rayjob(trial, {}, pool, settings=s, job=PythonJob(code))


def _wait(client: Any, name: str, done: Any) -> Any:
    deadline = time.time() + TIMEOUT
    seen = []
    while time.time() < deadline:
        state = client.state(name)
        if state is not None and (not seen or seen[-1] != state.phase):
            seen.append(state.phase)
        if done(state):
            return state, seen
        time.sleep(3)
    pytest.fail(f"RayJob {name} did not finish within {TIMEOUT}s; phases seen: {seen}")


def test_trial_runs_through_kueue_on_its_pool(cluster: Any) -> None:
    from orchestrator.k8s.client import Phase, RayJobClient
    from orchestrator.trial import TrialState

    api, ns = cluster
    client = RayJobClient(ns, api_client=api)
    job = _render(ns, "print('ablate-live-ok')", "ok")
    client.create(job)
    state, seen = _wait(client, job["metadata"]["name"], lambda s: s and s.phase.finished)
    assert state.phase is Phase.SUCCEEDED and state.trial_state is TrialState.DONE, (
        state.describe()
    )
    assert seen[0] in (Phase.QUEUED, Phase.STARTING)
    from kubernetes import client as k

    pods = k.CoreV1Api(api).list_namespaced_pod(
        ns, label_selector=f"ablate.io/rayjob={job['metadata']['name']}"
    )
    workers = [p for p in pods.items if p.metadata.labels.get("ablate.io/role") == "worker"]
    for p in workers:  # pinned: scheduled onto the dummy pool's node only
        node = k.CoreV1Api(api).read_node(p.spec.node_name)
        assert node.metadata.labels.get("ablate.io/dummy-pool") == "cpu-a"


def test_failure_brings_back_the_log_tail(cluster: Any) -> None:
    from orchestrator.k8s.client import Phase, RayJobClient

    api, ns = cluster
    client = RayJobClient(ns, api_client=api)
    job = _render(ns, "import sys; print('boom-7f3a'); sys.exit(3)", "fail")
    client.create(job)
    state, _ = _wait(client, job["metadata"]["name"], lambda s: s and s.phase.finished)
    assert state.phase is Phase.FAILED
    reason = client.failure_reason(job["metadata"]["name"], state)
    assert reason.startswith("infra_failure:") and "boom-7f3a" in reason


def test_cancel_deletes_the_rayjob(cluster: Any) -> None:
    from orchestrator.k8s.client import RayJobClient

    api, ns = cluster
    client = RayJobClient(ns, api_client=api)
    job = _render(ns, "import time; time.sleep(3600)", "cancel")
    name = job["metadata"]["name"]
    client.create(job)
    assert client.delete(name) is True
    _wait(client, name, lambda s: s is None)
