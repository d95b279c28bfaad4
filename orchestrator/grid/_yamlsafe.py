"""Loading untrusted YAML: size cap, UTF-8 only, safe tags only, no duplicate keys, no bombs.

Returns the data plus a map from key path to line number, so errors can point at the line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.exceptions import GridError

MAX_BYTES = 1 << 20  # 1 MiB: a grid file is a page of text, not a data set
MAX_NODES = 200_000  # after alias expansion; a "billion laughs" file blows past this at once

LineMap = dict[tuple[Any, ...], int]


def _expanded_size(node: Node, memo: dict[int, int], depth: int = 0) -> int:
    if depth > 64:
        return MAX_NODES + 1
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = MAX_NODES + 1  # a cycle counts as infinite
    size = 1
    if isinstance(node, SequenceNode):
        for child in node.value:
            size += _expanded_size(child, memo, depth + 1)
            if size > MAX_NODES:
                break
    elif isinstance(node, MappingNode):
        for k, v in node.value:
            size += _expanded_size(k, memo, depth + 1) + _expanded_size(v, memo, depth + 1)
            if size > MAX_NODES:
                break
    memo[key] = size
    return size


def _line_map(node: Node, path: tuple[Any, ...], out: LineMap, file: str) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            if not isinstance(k, ScalarNode):
                raise GridError("mapping keys must be plain scalars", file=file,
                                line=k.start_mark.line + 1, key=format_path(path))
            key = k.value
            if key == "<<":
                raise GridError("YAML merge keys (<<) are not supported", file=file,
                                line=k.start_mark.line + 1, key=format_path(path),
                                fix="write the keys out")
            if key in seen:
                raise GridError(f"duplicate key {key!r} (first at line {seen[key]})", file=file,
                                line=k.start_mark.line + 1, key=format_path(path + (key,)),
                                fix="keep one of them")
            seen[key] = k.start_mark.line + 1
            out[path + (key,)] = k.start_mark.line + 1
            _line_map(v, path + (key,), out, file)
    elif isinstance(node, SequenceNode):
        for i, child in enumerate(node.value):
            _line_map(child, path + (i,), out, file)


def format_path(path: tuple[Any, ...]) -> str:
    """``("axes", "pool", 2)`` -> ``axes.pool[2]``."""
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def load_yaml(path: str | Path, *, max_bytes: int = MAX_BYTES) -> tuple[dict[str, Any], LineMap]:
    """Load a YAML mapping from ``path`` safely; raise ``GridError`` with file:line on any problem."""
    file = str(path)
    try:
        p = Path(path)
        size = p.stat().st_size
        if size > max_bytes:
            raise GridError(f"file is {size} bytes, over the {max_bytes}-byte limit", file=file,
                            fix="a grid file should be small; split it or generate fewer values")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise GridError("file not found", file=file, fix="check the path") from None
    except IsADirectoryError:
        raise GridError("is a directory, not a grid file", file=file) from None
    except OSError as exc:
        raise GridError(f"cannot read file ({exc.strerror})", file=file) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GridError(f"not UTF-8 text (bad byte at offset {exc.start})", file=file,
                        fix="save the file as UTF-8") from None
    if "\x00" in text:
        raise GridError("contains NUL bytes: not a text file", file=file)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise GridError(f"not valid YAML: character #x{exc.character:04x} is not allowed",
                        file=file, fix="remove control characters") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise GridError("file is empty", file=file, fix="see grids/quickstart.yaml")
        if _expanded_size(node, {}) > MAX_NODES:
            raise GridError(f"YAML expands to more than {MAX_NODES} nodes (alias bomb?)",
                            file=file, fix="remove the anchors/aliases")
        lines: LineMap = {}
        _line_map(node, (), lines, file)
        data = loader.construct_document(node)
    except GridError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        if isinstance(exc, yaml.constructor.ConstructorError):
            problem = f"unsafe or unknown YAML tag ({problem})"
        raise GridError(f"not valid YAML: {problem}", file=file, line=line) from None
    except yaml.reader.ReaderError as exc:
        raise GridError(f"not valid YAML: character #x{exc.character:04x} is not allowed",
                        file=file, fix="remove control characters") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise GridError(f"not valid YAML: {type(exc).__name__}", file=file) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise GridError(f"top level must be a mapping, got {type(data).__name__}", file=file,
                        line=1, fix="see grids/quickstart.yaml")
    return data, lines
