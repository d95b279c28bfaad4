"""Schema errors explained: pydantic's first error on a grid file as a one-line ``GridError``
with file:line, key path, bad value, allowed values and a did-you-mean (``validate_schema``).
The semantic checks that follow it are in ``_validation``."""
from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import LineMap, format_path
from orchestrator.schema import GridFile


def validate_schema(data: dict[str, Any], lines: LineMap, file: str) -> GridFile:
    """The pydantic schema check, with the first error turned into a one-line GridError."""
    try:
        return GridFile.model_validate(data)
    except ValidationError as exc:
        # An unknown key explains a "missing" one (a typo), so report it first. A list or mapping
        # given where a union also allows a keyword (``rules: default | [...]``) is explained by
        # what is wrong inside it, not by "is not an allowed value" (or "should be a string":
        # ``recipe:`` is a name or a mapping of them).
        err = min(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden",
                                               e["type"] in _SCALARS | {"literal_error"}
                                               and isinstance(e.get("input"), (list, dict))))
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        loc = _trim_union_loc(loc, data)
        allowed, got, problem = _explain(err, data, loc)
        if _SCALARS <= {e["type"] for e in exc.errors() if _trim_union_loc(tuple(
                p for p in e["loc"] if not (isinstance(p, str) and "[" in p)), data) == loc}:
            # Every member of the value union failed: say what shape the value has, not what the
            # first member (bool) wanted.
            allowed, got, problem = None, None, _shape(_at(data, loc))
        line = None
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in lines:
                line = lines[loc[:cut]]
                break
        raise GridError(problem, file=file, line=line, key=format_path(loc) or None,
                        allowed=allowed, got=got) from None


_SCALARS = {"bool_type", "int_type", "float_type", "string_type"}


def _at(data: Any, loc: tuple[Any, ...]) -> Any:
    try:
        for p in loc:
            data = data[p]
    except (KeyError, IndexError, TypeError):
        return None
    return data


def _shape(value: Any) -> str:
    """Why ``value`` is not a grid value (a scalar, a flat list or a flat mapping of scalars)."""
    want = "a value is a scalar, a list of scalars or a mapping of scalars"
    if isinstance(value, list):
        inner = next((v for v in value if isinstance(v, (list, dict))), None)
        if inner is not None:
            what = "a list" if isinstance(inner, list) else "a mapping"
            return f"{what} nested in a list is not a value ({want})"
    if isinstance(value, dict):
        inner = next((v for v in value.values() if isinstance(v, (list, dict))), None)
        if inner is not None:
            what = "a list" if isinstance(inner, list) else "a mapping"
            return f"{what} nested in a mapping is not a value ({want})"
    return f"{type(value).__name__} {short_value(value)} is not a value ({want})"


def _trim_union_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    # pydantic adds union-member names (e.g. "list[...]", "int") to locations; keep real keys.
    out: list[Any] = []
    node = data
    for p in loc:
        if ((isinstance(node, Mapping) and p in node)
                or (isinstance(node, list) and isinstance(p, int) and p < len(node))):
            out.append(p)
            node = node[p]
    return tuple(out) if out else loc[:1]


def _explain(err: Mapping[str, Any], data: Any, loc: tuple[Any, ...]) -> tuple[
        list[str] | None, Any, str]:
    kind = err["type"]
    if kind == "extra_forbidden":
        parent: Any = data
        for p in loc[:-1]:
            parent = parent[p] if isinstance(parent, (Mapping, list)) else None
        allowed = _known_fields(loc[:-1])
        return allowed, loc[-1] if loc else None, f"unknown key {loc[-1]!r}" if loc else "unknown key"
    got = err.get("input")
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        allowed = [s.strip().strip("'\"") for s in expected.replace(" or ", ",").split(",") if s.strip()]
        return allowed, got, f"{short_value(got)} is not an allowed value"
    if kind == "missing":
        return None, None, "required key is missing"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if got is None or isinstance(got, (list, dict)):  # the key names it; no dump of a whole section
        return None, None, msg
    return None, None, f"{short_value(got)}: {msg}"


def _known_fields(loc: tuple[Any, ...]) -> list[str] | None:
    model: Any = GridFile
    for p in loc:
        if isinstance(p, int):
            continue
        field = getattr(model, "model_fields", {}).get(p)
        if field is None:
            return None
        model = _model_in(field.annotation)
        if model is None:
            return None
    return sorted(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def short_value(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
