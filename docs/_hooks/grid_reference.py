"""The grid reference: every key of a grid file, generated from ``orchestrator/schema.py``.

One table per pydantic model reachable from ``GridFile`` (the top level, then each nested
section in the order its key appears), one row per field: its dotted path, type, default,
the constraints pydantic enforces and what the code says it means.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from modeldoc import (
    cell,
    constraints_text,
    default_text,
    field_text,
    model_text,
    nested_models,
    type_text,
)
from pydantic import BaseModel

MEANINGS = Path(__file__).with_name("grid_keys.yaml")


def meanings() -> dict[str, str]:
    """The meanings ``grid_keys.yaml`` gives keys whose definition says nothing."""
    return yaml.safe_load(MEANINGS.read_text()) or {}


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def sections(root: type[BaseModel]) -> list[tuple[type[BaseModel], list[str]]]:
    """(model, the key paths that lead to it) for ``root`` and every model nested in it,
    breadth first, each model once."""
    found: dict[type[BaseModel], list[str]] = {root: [""]}
    queue = [root]
    while queue:
        model = queue.pop(0)
        prefix = _prefix(found[model][0])
        for name, info in model.model_fields.items():
            for how, sub in nested_models(info.annotation):
                path = f"{prefix}{name}{how}"
                if sub not in found:
                    found[sub] = []
                    queue.append(sub)
                found[sub].append(path)
    return list(found.items())


def _prefix(path: str) -> str:
    return path + "." if path else ""


def render(root: type[BaseModel]) -> str:
    """The reference as Markdown: a section per model, a table row per field."""
    parts: list[str] = []
    extra = meanings()
    for model, paths in sections(root):
        head = "Top level" if paths == [""] else ", ".join(f"`{p}`" for p in paths)
        parts.append(f"## {head} {{#{anchor(model)}}}\n")
        text = model_text(model)
        if text:
            parts.append(text + "\n")
        parts.append("| key | type | default | constraints | meaning |\n|---|---|---|---|---|")
        prefix = _prefix(paths[0])
        for name, info in model.model_fields.items():
            typ = type_text(info.annotation, lambda m: f"[mapping](#{anchor(m)})")
            parts.append("| " + " | ".join(cell(c) for c in (
                f"`{prefix}{name}`", typ, default_text(info), constraints_text(info),
                field_text(model, name) or extra.get(prefix + name, ""))) + " |")
        parts.append("")
    return "\n".join(parts)


def rows(root: type[BaseModel]) -> list[str]:
    """Every dotted key the reference documents (for tests)."""
    out = []
    for model, paths in sections(root):
        out += [f"{_prefix(paths[0])}{name}" for name in model.model_fields]
    return out
