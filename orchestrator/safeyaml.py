"""Reading the files a user names (grid files, pool catalogues, recipes) and their YAML, safely.

A path may name anything: ``/dev/zero``, a FIFO, a directory, a symlink to either, a log of
gigabytes. Only regular files are read: the type is checked before opening (a FIFO is never
opened), the open is non-blocking (a FIFO swapped in after the check cannot hang), and the
read stops at a hard byte cap whatever ``st_size`` claims.

The YAML is parsed by libyaml when it is there. Its event stream is checked first, without
building anything: nesting depth (the composer recurses, and libyaml's segfaults on a deep
document) and node count (so a 150,000-value file is refused in a fraction of a second, not
after the seconds it takes to build and validate). Then the document is composed, checked for
alias bombs, duplicate keys and merge keys, and constructed with the safe constructor.

Numbers are read as YAML 1.2 decimals: ``2e-3`` is a float, and the YAML 1.1 spellings that
silently mean something else (``1:30`` is 90, ``010`` is 8, ``0x10``, ``0b10``, ``1_000``)
are refused with what they would have meant, never reinterpreted.

Returns the data plus a map from key path to line number, so errors can point at the line.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver, Resolver

from orchestrator.exceptions import GridError

MAX_BYTES = 1 << 20  # 1 MiB: a grid file is a page of text, not a data set
MAX_NODES = 50_000  # in the text, and again after alias expansion ("billion laughs")
MAX_DEPTH = 64  # a grid is a few levels of mappings and lists

LineMap = dict[tuple[Any, ...], int]

# --------------------------------------------------------------------------- reading files


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path: str | Path, *, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (symlinks followed), at most ``max_bytes``.

    Anything else (a directory, FIFO, device, socket, a file over the cap) is a ``GridError``
    naming the file; nothing here can block or read without bound."""
    file = str(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise GridError(f"is {_kind(st.st_mode)}, not a regular file", file=file,
                            fix="name a YAML file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise GridError("file not found", file=file, fix="check the path") from None
    except OSError as exc:
        raise GridError(f"cannot read file ({exc.strerror})", file=file) from None
    chunks: list[bytes] = []
    total = 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the check and the open
            raise GridError(f"is {_kind(st.st_mode)}, not a regular file", file=file,
                            fix="name a YAML file")
        while True:
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise GridError(f"file is over the {max_bytes}-byte limit", file=file,
                                fix="a grid file should be small; split it or generate fewer "
                                    "values")
    except OSError as exc:
        raise GridError(f"cannot read file ({exc.strerror})", file=file) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


# --------------------------------------------------------------------------- numbers

INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
NON_DECIMAL_TAG = "tag:rl-ablate,2026:non-decimal"
_DIGITS = list("-+0123456789")
_DECIMAL_INT = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")
_DECIMAL_FLOAT = re.compile(r"""^(?:[-+]?(?:(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?
                                 |[0-9]+[eE][-+]?[0-9]+)
                                 |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.VERBOSE)
# What YAML 1.1 reads as a number although no one writes a number so: base 60, octal by a
# leading zero, hex, binary, and digit groups with underscores.
_NON_DECIMAL = re.compile(r"""^[-+]?(?:0[0-9_]+(?:\.[0-9_]*)?|0[xX][0-9a-fA-F_]+|0[oO][0-7_]+
                              |0[bB][01_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?
                              |[0-9][0-9_]*_[0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
                              |[0-9]*\.[0-9]*_[0-9_]*(?:[eE][-+]?[0-9]+)?)$""", re.VERBOSE)


class _Resolver(BaseResolver):
    """YAML 1.1's safe resolvers (null, bool, merge), but YAML 1.2 numbers and no timestamps
    (a date is text, not a value any key takes)."""


for _first, _items in Resolver.yaml_implicit_resolvers.items():
    for _tag, _regexp in _items:
        if _tag not in (INT_TAG, FLOAT_TAG, TIMESTAMP_TAG):
            _Resolver.add_implicit_resolver(_tag, _regexp, [_first])
_Resolver.add_implicit_resolver(INT_TAG, _DECIMAL_INT, _DIGITS)
_Resolver.add_implicit_resolver(FLOAT_TAG, _DECIMAL_FLOAT, [*_DIGITS, "."])
_Resolver.add_implicit_resolver(NON_DECIMAL_TAG, _NON_DECIMAL, _DIGITS)

if yaml.__with_libyaml__:
    from yaml.cyaml import CParser

    class _Loader(CParser, SafeConstructor, _Resolver):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            _Resolver.__init__(self)
else:  # pragma: no cover - PyYAML without libyaml: the same rules, in Python
    from yaml.composer import Composer
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(Reader, Scanner, Parser, Composer, SafeConstructor, _Resolver):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            _Resolver.__init__(self)


def _spelling(text: str) -> str:
    """Why a YAML 1.1 number spelling is refused, with the value it would have had."""
    body = text.lstrip("+-")
    kind = ("a base-60 (sexagesimal)" if ":" in body else "a hexadecimal" if body[:2] in ("0x", "0X")
            else "a binary" if body[:2] in ("0b", "0B") else "an underscore-grouped"
            if "_" in body else "an octal-looking (leading zero)")
    try:
        old = yaml.safe_load(text)
    except yaml.YAMLError:
        old = None
    meant = (f"YAML 1.1 reads it as {old}" if isinstance(old, (int, float))
             and not isinstance(old, bool) else "YAML versions read it differently")
    return (f"{_short(text)} is {kind} number spelling ({meant}); write the number in plain "
            "decimal, or quote it if it is text")


def _short(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit - 3]) + "..."


# --------------------------------------------------------------------------- parsing


def _check_events(loader: Any, file: str) -> int:
    """Depth and size limits on the event stream: nothing is built yet, nothing recurses.
    Returns the number of aliases."""
    depth = nodes = aliases = 0
    while loader.check_event():
        event = loader.get_event()
        if isinstance(event, (ScalarEvent, AliasEvent, CollectionStartEvent)):
            nodes += 1
            if nodes > MAX_NODES:
                raise GridError(f"holds more than {MAX_NODES} values", file=file,
                                line=event.start_mark.line + 1,
                                fix="a grid lists axis values and seeds, not data; use fewer "
                                    "values or split the grid")
        if isinstance(event, AliasEvent):
            aliases += 1
        elif isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise GridError(f"mappings and lists are nested more than {MAX_DEPTH} levels "
                                "deep", file=file, line=event.start_mark.line + 1,
                                fix="a grid is a few levels deep; flatten it")
        elif isinstance(event, CollectionEndEvent):
            depth -= 1
    return aliases


def _expanded_size(node: Node, memo: dict[int, int], depth: int = 0) -> int:
    if depth > 8 * MAX_DEPTH:  # only aliases nest this deep: the text is at most MAX_DEPTH
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


def _scalar(node: ScalarNode, path: tuple[Any, ...], file: str) -> None:
    if node.tag == NON_DECIMAL_TAG:
        raise GridError(_spelling(node.value), file=file, line=node.start_mark.line + 1,
                        key=format_path(path) or None)


def _line_map(node: Node, path: tuple[Any, ...], out: LineMap, file: str,
              merge: bool = False) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, ScalarNode):
        _scalar(node, path, file)
    elif isinstance(node, MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            if not isinstance(k, ScalarNode):
                raise GridError("mapping keys must be plain scalars", file=file,
                                line=k.start_mark.line + 1, key=format_path(path))
            _scalar(k, path, file)
            key = k.value
            if key == "<<" and not merge:
                raise GridError("YAML merge keys (<<) are not supported", file=file,
                                line=k.start_mark.line + 1, key=format_path(path),
                                fix="write the keys out")
            if key in seen:
                raise GridError(f"duplicate key {key!r} (first at line {seen[key]})", file=file,
                                line=k.start_mark.line + 1, key=format_path(path + (key,)),
                                fix="keep one of them")
            seen[key] = k.start_mark.line + 1
            out[path + (key,)] = k.start_mark.line + 1
            _line_map(v, path + (key,), out, file, merge)
    elif isinstance(node, SequenceNode):
        for i, child in enumerate(node.value):
            _line_map(child, path + (i,), out, file, merge)


def format_path(path: tuple[Any, ...]) -> str:
    """``("axes", "pool", 2)`` -> ``axes.pool[2]``."""
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _yaml_error(exc: Exception, file: str) -> GridError:
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
        return GridError(f"not valid YAML: character #x{char:04x} is not allowed",
                         file=file, fix="remove control characters")
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if isinstance(exc, yaml.constructor.ConstructorError):
            problem = f"unsafe or unknown YAML tag ({problem})"
        return GridError(f"not valid YAML: {problem}", file=file,
                         line=mark.line + 1 if mark else None)
    return GridError(f"not valid YAML: {type(exc).__name__}", file=file)


def loads(text: str, *, file: str = "<text>", merge: bool = False) -> tuple[Any, LineMap]:
    """Parse one YAML document under the rules above; ``GridError`` with file:line on any
    problem. An empty document is ``None``. ``merge`` allows YAML merge keys (``<<``)."""
    if "\x00" in text:
        raise GridError("contains NUL bytes: not a text file", file=file)
    text = text.removeprefix("\ufeff")
    lines: LineMap = {}
    try:
        events = _Loader(text)
        try:
            aliases = _check_events(events, file)
        finally:
            events.dispose()
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, lines
            if aliases and _expanded_size(node, {}) > MAX_NODES:
                raise GridError(f"YAML aliases expand to more than {MAX_NODES} values (an alias "
                                "bomb)", file=file, fix="remove the anchors/aliases")
            _line_map(node, (), lines, file, merge)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except GridError:
        raise
    except (yaml.YAMLError, RecursionError) as exc:
        raise _yaml_error(exc, file) from None
    return data, lines


def load_yaml(path: str | Path, *, max_bytes: int = MAX_BYTES,
              merge: bool = False) -> tuple[dict[str, Any], LineMap]:
    """Load a YAML mapping from ``path`` safely; raise ``GridError`` with file:line on any problem."""
    file = str(path)
    raw = read_capped(path, max_bytes=max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GridError(f"not UTF-8 text (bad byte at offset {exc.start})", file=file,
                        fix="save the file as UTF-8") from None
    data, lines = loads(text, file=file, merge=merge)
    if data is None:
        raise GridError("file is empty", file=file, fix="see grids/quickstart.yaml")
    if not isinstance(data, dict):
        raise GridError(f"top level must be a mapping, got {type(data).__name__}", file=file,
                        line=1, fix="see grids/quickstart.yaml")
    return data, lines
