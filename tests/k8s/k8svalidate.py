"""Validate manifests: core kinds against the Kubernetes OpenAPI schemas shipped in
kubernetes-validate (strict), KubeRay/Kueue kinds against our compact schemas
(tests/data/k8s_schemas, always) and the official CRDs from $ABLATE_CRD_DIR (when set).

Plus the security policy every pod must meet (no host paths, no privilege, limits everywhere,
secrets only by reference).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

K8S_VERSION = "1.35"  # a recent release kubernetes-validate ships (strict schemas)
SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "k8s_schemas"
CRD_KINDS = {
    ("ray.io/v1", "RayJob"): "rayjob.v1.json",
    ("ray.io/v1", "RayCluster"): "raycluster.v1.json",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "resourceflavor.v1beta2.json",
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): "clusterqueue.v1beta2.json",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "localqueue.v1beta2.json",
}
SECRETISH = re.compile(r"(TOKEN|PASSWORD|SECRET|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.IGNORECASE)


class ManifestInvalid(AssertionError):
    pass


def _definitions() -> Resource:
    import importlib.resources as ir

    root = ir.files("kubernetes_validate") / "kubernetes-json-schema"
    path = root / f"v{K8S_VERSION}.0-local-strict" / "_definitions.json"
    return Resource.from_contents(json.loads(path.read_text()))


@functools.cache
def compact_validator(file: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / file).read_text())
    registry = Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json", _definitions()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _close(node: Any) -> Any:
    """Close every object that lists its properties (see the compact schemas for why)."""
    if isinstance(node, dict):
        out = {k: _close(v) for k, v in node.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_close(v) for v in node]
    return node


def crd_dir() -> Path | None:
    d = os.environ.get("ABLATE_CRD_DIR")
    return Path(d) if d else None


@functools.cache
def official_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """Validator from the official CRD file in $ABLATE_CRD_DIR for ``kind`` at ``api_version``."""
    group, version = api_version.split("/")
    d = crd_dir()
    assert d is not None
    for f in sorted(d.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        if crd["spec"]["group"] != group or crd["spec"]["names"]["kind"] != kind:
            continue
        for v in crd["spec"]["versions"]:
            if v["name"] == version:
                schema = _close(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
                # status is written by the controllers, never by us.
                schema.get("properties", {}).pop("status", None)
                return jsonschema.Draft202012Validator(schema)
    raise FileNotFoundError(f"no CRD for {kind} {api_version} in {d}")


def _fail(obj: dict[str, Any], how: str, err: Exception) -> ManifestInvalid:
    name = (obj.get("metadata") or {}).get("name")
    path = "/".join(str(p) for p in getattr(err, "absolute_path", []))
    msg = getattr(err, "message", str(err))
    return ManifestInvalid(f"{obj.get('kind')}/{name} ({how}): {path}: {msg}")


def validate(obj: dict[str, Any]) -> list[str]:
    """Validate one object; returns the checks it passed, raises ManifestInvalid otherwise."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    passed = []
    if key in CRD_KINDS:
        try:
            compact_validator(CRD_KINDS[key]).validate(obj)
        except jsonschema.ValidationError as e:
            raise _fail(obj, "compact schema", e) from None
        passed.append("compact")
        if crd_dir():
            try:
                official_validator(*key).validate(obj)
            except jsonschema.ValidationError as e:
                raise _fail(obj, "official CRD", e) from None
            passed.append("official-crd")
    else:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise _fail(obj, f"kubernetes {K8S_VERSION} strict", e) from None
        passed.append("core")
    check_policy(obj)
    return passed


# --------------------------------------------------------------------------- policy


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec inside an object (Deployments, StatefulSets, Jobs, RayJobs, RayClusters)."""
    spec = obj.get("spec") or {}
    kind = obj.get("kind")
    if kind in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        yield kind, spec["template"]["spec"]
    elif kind == "Pod":
        yield kind, spec
    cluster = (
        spec.get("rayClusterSpec") if kind == "RayJob" else spec if kind == "RayCluster" else None
    )
    if kind == "RayJob" and spec.get("submitterPodTemplate"):
        yield "submitter", spec["submitterPodTemplate"]["spec"]
    if cluster:
        yield "head", cluster["headGroupSpec"]["template"]["spec"]
        for g in cluster.get("workerGroupSpecs") or []:
            yield f"worker {g['groupName']}", g["template"]["spec"]


def check_policy(obj: dict[str, Any]) -> None:
    """No host paths or host namespaces, no privilege, requests+limits, secrets by reference."""
    name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    for role, pod in pod_specs(obj):
        where = f"{name} {role}"
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(flag):
                raise ManifestInvalid(f"{where}: {flag} is set")
        for v in pod.get("volumes") or []:
            if "hostPath" in v:
                raise ManifestInvalid(f"{where}: hostPath volume {v['name']}")
        pod_sc = pod.get("securityContext") or {}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            sc = c.get("securityContext") or {}
            cw = f"{where} container {c['name']}"
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is not False:
                raise ManifestInvalid(f"{cw}: privileged or privilege escalation allowed")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                raise ManifestInvalid(f"{cw}: capabilities not dropped")
            if (sc.get("capabilities") or {}).get("add"):
                raise ManifestInvalid(f"{cw}: adds capabilities")
            if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
                raise ManifestInvalid(f"{cw}: may run as root")
            res = c.get("resources") or {}
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in (res.get(kind) or {}):
                        raise ManifestInvalid(f"{cw}: no {r} {kind}")
            for e in c.get("env") or []:
                vf = e.get("valueFrom")
                if vf is not None and set(vf) - {"secretKeyRef", "configMapKeyRef", "fieldRef"}:
                    raise ManifestInvalid(f"{cw}: env {e['name']} from {set(vf)}")
                literal = e.get("value", "")
                if vf is None and SECRETISH.search(e["name"]) and "$(" not in literal:
                    raise ManifestInvalid(f"{cw}: env {e['name']} carries a literal secret")


def load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]
