"""What the code says about a pydantic model's fields: types, defaults, constraints and text.

A field's text is its ``description`` if it has one, else the comments written next to it in
the class body (on its line, or the comment lines right above it), else the row for it in a
``key  meaning`` table of its module's docstring (as ``orchestrator/corrections.py`` has). So
the reference pages say what the code says, and a new field shows up with whatever its author
wrote beside it.
"""
from __future__ import annotations

import ast
import enum
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@cache
def source_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comments beside its definition in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith(("fmt:", "noqa", "type:")):
                comments[tok.start[0]] = text
    lines = source.splitlines()
    cls = ast.parse(source).body[0]
    out: dict[str, str] = {}
    for node in getattr(cls, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                  if n in comments and not lines[n - 1].lstrip().startswith("#")]
        text = " ".join(above + beside).strip()
        if text:
            out[node.target.id] = text
    return out


@cache
def docstring_table(module_name: str) -> dict[str, str]:
    """``key -> meaning`` from a reStructuredText simple table in a module's docstring."""
    doc = inspect.getdoc(sys.modules[module_name]) or ""
    rows: dict[str, str] = {}
    blocks = re.split(r"^=+(?:[ \t]+=+)+[ \t]*$", doc, flags=re.MULTILINE)
    # A simple table is: rule, header, rule, rows, rule; the rows are the third block.
    if len(blocks) >= 4:
        for line in blocks[2].strip("\n").splitlines():
            key, _, meaning = line.strip().partition(" ")
            if key and meaning.strip():
                rows[key] = rst(" ".join(meaning.split()))
    return rows


def field_text(model: type[BaseModel], name: str) -> str:
    """What the code says a field means (empty if it says nothing)."""
    info = model.model_fields[name]
    if info.description:
        return info.description
    return source_comments(model).get(name) or docstring_table(model.__module__).get(name, "")


def model_text(model: type[BaseModel]) -> str:
    """A model's docstring, reflowed into paragraphs (double backticks made Markdown)."""
    doc = model.__dict__.get("__doc__") or ""  # its own, not BaseModel's
    return rst(inspect.cleandoc(doc))


def rst(text: str) -> str:
    """Docstring text as Markdown: ``x`` -> `x`, :func:`x` -> `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# --------------------------------------------------------------------------- types

def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def nested_models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """The models inside an annotation, each with how it is reached: '' (the value itself),
    '[]' (items of a list) or '.<key>' (values of a mapping)."""
    annotation = _strip(annotation)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _is_union(annotation):
        return [m for a in args for m in nested_models(a)]
    if origin in (list, tuple) and args:
        return [("[]" + how, m) for how, m in nested_models(args[0])]
    if origin is dict and len(args) == 2:
        return [(".<key>" + how, m) for how, m in nested_models(args[1])]
    return []


_SCALARS = {bool, int, float, str, type(None)}


def _scalar(annotation: Any) -> bool:
    annotation = _strip(annotation)
    return any(annotation is s or (inspect.isclass(annotation) and issubclass(annotation, s)
                                    and s is not int) for s in _SCALARS) or annotation is int


def _scalars(annotation: Any) -> bool:
    """A union of every scalar type: what a grid calls a scalar."""
    args = typing.get_args(_strip(annotation)) if _is_union(_strip(annotation)) else ()
    return len(args) == len(_SCALARS) and all(_scalar(a) for a in args)


def _value(annotation: Any) -> bool:
    """scalar | list of scalar | mapping of scalar: what a grid calls a value."""
    annotation = _strip(annotation)
    if not _is_union(annotation):
        return False
    args = typing.get_args(annotation)
    scal = [a for a in args if _scalar(a)]
    rest = [a for a in args if not _scalar(a)]
    return (len(scal) == len(_SCALARS) and len(rest) == 2
            and {typing.get_origin(_strip(r)) for r in rest} == {list, dict}
            and all(_scalars(typing.get_args(_strip(r))[-1]) for r in rest))


_NAMES = {bool: "bool", int: "int", float: "number", str: "text", type(None): "null"}


def type_text(annotation: Any, link: typing.Callable[[type[BaseModel]], str]) -> str:
    """A reader's name for a type: ``int``, ``a | b``, ``list of number``, a link to a model."""
    annotation = _strip(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _value(annotation):
        return "value"
    if _scalars(annotation):
        return "scalar"
    if (_is_union(annotation) and any(_value(a) for a in args)
            and all(_scalar(a) or _value(a) for a in args)):
        return "value"  # e.g. Value | None
    if origin is typing.Literal:
        return " | ".join(f"`{'null' if a is None else a}`" for a in args)
    if _is_union(annotation):
        parts = list(dict.fromkeys(type_text(a, link) for a in args))
        if "number" in parts and "int" in parts:  # an int is a number
            parts.remove("int")
        return " | ".join(parts)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return link(annotation)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return " | ".join(f"`{m.value}`" for m in annotation)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(type_text(a, link) for a in args) + "]"
        return f"list of {type_text(args[0], link)}" if args else "list"
    if origin is dict:
        return (f"mapping {type_text(args[0], link)} → {type_text(args[1], link)}"
                if args else "mapping")
    for base, name in _NAMES.items():
        if annotation is base or (inspect.isclass(annotation) and issubclass(annotation, base)):
            return name
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo) -> str:
    """The default as YAML would spell it, or 'required'."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(see its keys)"
    if value is None:
        return "`null`"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join("null" if v is None else str(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def constraints_text(info: FieldInfo) -> str:
    """Bounds, patterns and lengths pydantic enforces on the field (and its Annotated parts)."""
    found: list[str] = []
    options = typing.get_args(_strip(info.annotation)) if _is_union(_strip(info.annotation)) \
        else (info.annotation,)
    text = any(inspect.isclass(_strip(o)) and issubclass(_strip(o), str) for o in options)
    unit = "characters" if text else "entries"

    def collect(meta: Any) -> None:
        for attr, sign in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        for attr, label in (("pattern", "matches"), ("min_length", "at least"),
                            ("max_length", "at most")):
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{label} `{value}`" if attr == "pattern" else
                             f"{label} {value} {unit}")

    for meta in info.metadata:
        collect(meta)
    annotation = info.annotation
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in typing.get_args(annotation)[1:]:
            collect(meta)
    return "; ".join(dict.fromkeys(found))


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")
