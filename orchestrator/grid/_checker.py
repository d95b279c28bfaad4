"""The key and value checker of a grid's semantic checks: a dotted key against the composed
recipe and the typed sections, a value against its type and allowed values.

Apart from the checks themselves (``_validation``, ``_cells``, ``_adaptive``, expansion's
derived trials) because each of them is handed one ``Checker`` and needs only its type.
"""
from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import recipes
from orchestrator.exceptions import GridError
from orchestrator.grid._schema_errors import short_value as _short
from orchestrator.grid._spec import SECTIONS
from orchestrator.safeyaml import LineMap, format_path


def _allowed_values(model: type[BaseModel], field: str) -> list[str] | None:
    ann = model.model_fields[field].annotation
    lits: list[str] = []
    for arg in (ann, *typing.get_args(ann)):
        if typing.get_origin(arg) is typing.Literal:
            lits += [str(a) for a in typing.get_args(arg)]
    return lits or None


class Checker:
    """Validates keys and values against the recipe and the vocabularies."""

    def __init__(self, grid_file: str, lines: LineMap, base: Mapping[str, Any]) -> None:
        self.file, self.lines = grid_file, lines
        self.leaves = dict(recipes.flatten({k: v for k, v in base.items() if k not in SECTIONS}))

    def err(self, problem: str, path: tuple[Any, ...], **kw: Any) -> GridError:
        line = None
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                line = self.lines[path[:cut]]
                break
        return GridError(problem, file=self.file, line=line, key=format_path(path), **kw)

    def key(self, key: str, path: tuple[Any, ...]) -> None:
        section, _, field = key.partition(".")
        if section in SECTIONS:
            fields = list(SECTIONS[section].model_fields)
            if field not in fields:
                raise self.err(f"unknown key {key!r}", path, allowed=[f"{section}.{f}" for f in fields],
                               got=key)
            return
        if key not in self.leaves:
            allowed = sorted(self.leaves) + [f"{s}.{f}" for s, m in SECTIONS.items() for f in m.model_fields]
            raise self.err(f"unknown key {key!r}: not in the recipe", path, allowed=allowed, got=key,
                           fix="override a leaf key of the recipe (see `ablate plan --show-recipe`)")

    def value(self, key: str, value: Any, path: tuple[Any, ...]) -> Any:
        self.key(key, path)
        section, _, field = key.partition(".")
        if section in SECTIONS:
            model = SECTIONS[section]
            try:
                model.model_validate({field: value})
            except ValidationError as exc:
                # Cross-field rules (loc == ()) depend on the other axes: they are checked per
                # combination at expansion. Here only the value itself is judged.
                field_errors = [e for e in exc.errors() if e["loc"]]
                if field_errors:
                    allowed = _allowed_values(model, field)
                    problem = f"{_short(value)} is not valid for {key}"
                    if not allowed:
                        problem += f" ({field_errors[0]['msg'].removeprefix('Value error, ')})"
                    raise self.err(problem, path, allowed=allowed, got=value) from None
            return value
        default = self.leaves[key]
        if isinstance(value, float) and not math.isfinite(value):
            raise self.err(f"{value} is not a finite number", path, fix="give a finite value")
        if not _same_type(default, value):
            raise self.err(f"{_short(value)} has type {type(value).__name__}, expected "
                           f"{type(default).__name__} like the recipe default {_short(default)}",
                           path)
        return value


def _same_type(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    return isinstance(value, type(default))
