"""k8s/ (kustomize base + overlays): every object validates, RBAC is least privilege, secrets are
only referenced, and our resolver agrees with `kubectl kustomize` where that binary exists."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from k8shelpers import REPO
from k8svalidate import ManifestInvalid, check_policy, load_all, pod_specs, validate
from kustomize import build

KUSTOMIZATIONS = ("k8s/base", "k8s/overlays/onprem")
ROLE_RULES = {  # the whole grant: (apiGroup, resource) -> verbs
    ("ray.io", "rayjobs"): {"create", "get", "list", "watch", "delete"},
    ("", "pods"): {"get", "list"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"list", "watch"},
}
DOCUMENTED_SECRETS = {"ablate-postgres", "ablate-s3", "ablate-hf-token", "ablate-mlflow-auth"}


@pytest.fixture(params=KUSTOMIZATIONS)
def objects(request: pytest.FixtureRequest) -> list[dict]:
    return build(REPO / request.param)


def test_every_object_validates(objects: list[dict]) -> None:
    kinds: dict[str, int] = {}
    for obj in objects:
        assert validate(obj)
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    assert kinds["ResourceFlavor"] == 5 and kinds["ClusterQueue"] == 1 and kinds["LocalQueue"] == 1
    assert kinds["RayCluster"] == 1 and kinds["Role"] == 1 and kinds["RoleBinding"] == 1
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert "Secret" not in kinds  # secrets are created by the operator, never shipped


def test_overlay_wires_minio_and_rwx_storage() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in build(REPO / "k8s/overlays/onprem")}
    assert objs[("ConfigMap", "mlflow-config")]["data"]["MLFLOW_S3_ENDPOINT_URL"] == (
        "http://ablate-minio:9000"
    )
    # The base keys survive the patch (strategic merge, not replace).
    assert "MLFLOW_ARTIFACTS_DESTINATION" in objs[("ConfigMap", "mlflow-config")]["data"]
    pvc = objs[("PersistentVolumeClaim", "ablate-checkpoints")]["spec"]
    assert pvc["storageClassName"] == "nfs-client" and pvc["accessModes"] == ["ReadWriteMany"]
    assert ("Deployment", "ablate-minio") in objs and ("Job", "ablate-minio-bucket") in objs
    image = objs[("Deployment", "mlflow")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.internal/rl-ablate/mlflow-server:3.17.2"


def test_namespaced_objects_live_in_the_ablate_namespace(objects: list[dict]) -> None:
    cluster_scoped = {"Namespace", "ResourceFlavor", "ClusterQueue"}
    for o in objects:
        ns = o["metadata"].get("namespace")
        assert (ns is None) if o["kind"] in cluster_scoped else (ns == "ablate"), o["metadata"]


@pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl not installed: the resolver is then only checked by the tests above",
)
@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_resolver_matches_kubectl_kustomize(path: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"kubectl kustomize failed here: {out.stderr.strip()[:200]}")

    def key(o: dict) -> tuple:
        return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]

    theirs = {key(o): o for o in load_all(out.stdout)}
    ours = {key(o): o for o in build(REPO / path)}
    assert ours == theirs


# --------------------------------------------------------------------------- RBAC


def _rbac() -> dict[str, list[dict]]:
    objs = build(REPO / "k8s/base")
    out: dict[str, list[dict]] = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_role_grants_nothing_beyond_the_listed_verbs() -> None:
    rbac = _rbac()
    (role,) = rbac["Role"]
    assert role["metadata"]["namespace"] == "ablate"
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule["apiGroups"] and "resourceNames" not in rule
        assert "nonResourceURLs" not in rule
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                granted.setdefault((g, r), set()).update(rule["verbs"])
    assert granted == ROLE_RULES
    # Nothing that escalates: no secrets, no RBAC objects, no pods/exec, no create on pods.
    flat = {r for _, r in granted}
    assert not flat & {
        "secrets",
        "roles",
        "rolebindings",
        "pods/exec",
        "pods/attach",
        "serviceaccounts/token",
        "rayclusters",
    }


def test_nothing_is_granted_cluster_wide() -> None:
    rbac = _rbac()
    assert "ClusterRole" not in rbac and "ClusterRoleBinding" not in rbac
    (binding,) = rbac["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "ablate-orchestrator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ablate-orchestrator", "namespace": "ablate"}
    ]
    trial_sa = next(s for s in rbac["ServiceAccount"] if s["metadata"]["name"] == "ablate-trial")
    assert trial_sa["automountServiceAccountToken"] is False


def test_client_uses_only_granted_verbs() -> None:
    """Every API call in orchestrator/k8s/client.py maps to a verb the Role grants."""
    import re

    src = (REPO / "orchestrator/k8s/client.py").read_text()
    calls = set(re.findall(r"\.(\w+_namespaced_\w+)\b", src))
    verb_of = {
        "create_namespaced_custom_object": ("ray.io", "rayjobs", "create"),
        "get_namespaced_custom_object": ("ray.io", "rayjobs", "get"),
        "delete_namespaced_custom_object": ("ray.io", "rayjobs", "delete"),
        "list_namespaced_event": ("", "events", "list"),
        "list_namespaced_pod": ("", "pods", "list"),
        "read_namespaced_pod_log": ("", "pods/log", "get"),
    }
    assert calls == set(verb_of)
    for g, r, v in verb_of.values():
        assert v in ROLE_RULES[(g, r)]


# --------------------------------------------------------------------------- secrets and policy


def test_secrets_only_by_reference_and_documented(objects: list[dict]) -> None:
    readme = (REPO / "k8s/README.md").read_text()
    used = set()
    for o in objects:
        for _, pod in pod_specs(o):
            for c in pod["containers"]:
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        used.add(ref["name"])
    assert used and used <= DOCUMENTED_SECRETS
    for name in used:
        assert f"kubectl -n ablate create secret generic {name}" in readme


def test_policy_check_catches_violations() -> None:
    """The policy check is not vacuous: each violation is caught."""
    import copy

    objs = {(o["kind"], o["metadata"]["name"]): o for o in build(REPO / "k8s/base")}
    base = objs[("Deployment", "mlflow")]
    breaks = [
        lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        lambda p: p["containers"][0]["securityContext"].__setitem__("privileged", True),
        lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        lambda p: p["containers"][0]["securityContext"]["capabilities"].__setitem__("drop", []),
        lambda p: p["containers"][0]["resources"].pop("limits"),
        lambda p: p["containers"][0]["env"].append({"name": "DB_PASSWORD", "value": "hunter2"}),
        lambda p: p.__setitem__("hostNetwork", True),
    ]
    for brk in breaks:
        bad = copy.deepcopy(base)
        brk(bad["spec"]["template"]["spec"])
        with pytest.raises(ManifestInvalid):
            check_policy(bad)
