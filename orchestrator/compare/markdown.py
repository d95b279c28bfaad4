"""Text a user gave (labels, axis values, pool names, reasons, paths), made safe for Markdown.

Every Markdown the tool writes goes through here: ``results/<grid>/summary.md`` and the parent
MLflow run's ``mlflow.note.content``, which the MLflow UI renders (raw HTML included). A label
such as ``<img src=x onerror=alert(1)>`` must show as that text, never become markup: HTML's
``& < >`` become entities; the characters that start markup inline (code spans, emphasis,
links and images, table cells, strikethrough) are backslash-escaped, ``_`` unless it sits
inside a word (``is_level`` is inert, and stays readable); line breaks become spaces so a value
cannot open a new block.
"""
from __future__ import annotations

import re

_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_MARKUP = re.compile(r"([\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def text(value: object) -> str:
    """``value`` as inline Markdown that renders as exactly its characters."""
    out = " ".join(str(value).split())
    out = re.sub(r"[&<>]", lambda m: _HTML[m.group()], out)
    return _MARKUP.sub(r"\\\1", out)


def code(value: object) -> str:
    """``value`` as an inline code span (rendered monospace and literally): the fence is longer
    than any backtick run inside, so the value cannot close it."""
    inner = " ".join(str(value).split())
    longest = max((len(run) for run in re.findall(r"`+", inner)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if inner.startswith("`") or inner.endswith("`") else ""
    return f"{fence}{pad}{inner}{pad}{fence}"
