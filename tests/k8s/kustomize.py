"""A small, faithful `kustomize build` for the features k8s/ uses, so tests run without binaries.

Supported (anything else in a kustomization is an error, so the resolver never silently differs
from kustomize): ``resources`` (files and directories with a kustomization.yaml), ``patches``
with ``path`` only (strategic-merge patches matched by apiVersion group, kind, name and
namespace; lists of named items merge by ``name``), and ``images`` (``newName``/``newTag`` for
every ``containers``/``initContainers`` image at any depth, as kustomize's image transformer).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN = {"apiVersion", "kind", "resources", "patches", "images"}
MERGE_BY_NAME = {"containers", "initContainers", "env", "volumes", "volumeMounts", "ports"}


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    meta = obj.get("metadata") or {}
    return group, obj["kind"], meta.get("namespace", ""), meta["name"]


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        if "$patch" in patch:
            raise ValueError("$patch directives are not supported by this resolver")
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and field in MERGE_BY_NAME
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        out = [copy.deepcopy(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = _merge(out[index[item["name"]]], item, "")
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _set_images(node: Any, images: list[dict[str, str]]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("containers", "initContainers") and isinstance(v, list):
                for c in v:
                    c["image"] = _image(c.get("image", ""), images)
            _set_images(v, images)
    elif isinstance(node, list):
        for v in node:
            _set_images(v, images)


def _image(ref: str, images: list[dict[str, str]]) -> str:
    name, digest = (ref.split("@", 1) + [""])[:2]
    slash = name.rfind("/")
    colon = name.rfind(":")
    base, tag = (name[:colon], name[colon + 1 :]) if colon > slash else (name, "")
    for im in images:
        if im["name"] == base:
            base = im.get("newName", base)
            if "newTag" in im:
                return f"{base}:{im['newTag']}"
            return f"{base}:{tag}" if tag else (f"{base}@{digest}" if digest else base)
    return ref


def build(directory: str | Path) -> list[dict[str, Any]]:
    """The objects `kustomize build DIRECTORY` would emit (order: resources order)."""
    d = Path(directory)
    kust = yaml.safe_load((d / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kust) - KNOWN
    if unknown:
        raise ValueError(
            f"{d}/kustomization.yaml uses {sorted(unknown)}, which this resolver "
            "does not implement"
        )
    objs: list[dict[str, Any]] = []
    for res in kust.get("resources") or []:
        p = d / res
        objs.extend(build(p) if p.is_dir() else _load(p))
    keys = [_key(o) for o in objs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{d}: duplicate objects")
    for patch in kust.get("patches") or []:
        if set(patch) != {"path"}:
            raise ValueError(f"{d}: only path-only patches are supported, got {patch}")
        for pobj in _load(d / patch["path"]):
            k = _key(pobj)
            if k not in keys:
                raise ValueError(f"{d}: patch {patch['path']} matches no object {k}")
            i = keys.index(k)
            objs[i] = _merge(objs[i], pobj)
    if kust.get("images"):
        for o in objs:
            _set_images(o, kust["images"])
    return objs
