"""User text in Markdown renders as its characters: no HTML, no links, no table breakout."""
from __future__ import annotations

import pytest

from orchestrator.compare import markdown as md

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "![x](http://evil/x.png)",
    "a | b | c",
    "`code` and ``more``",
    "*bold* _em_ ~~gone~~",
    "line1\n# heading\r\n- item",
    "&lt;already&gt; &amp;",
    "back\\slash\\",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_text_has_no_live_markup(value: str) -> None:
    out = md.text(value)
    assert "<" not in out and ">" not in out and "\n" not in out and "\r" not in out
    for ch in "[]|`*~":
        assert out.count(ch) == out.count("\\" + ch), (ch, out)
    # Undo the escapes: the reader sees exactly the value (line breaks as spaces).
    shown = (out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    for ch in "\\[]|`*~_":
        shown = shown.replace("\\" + ch, ch)
    assert shown == " ".join(value.split())


def test_text_keeps_ordinary_labels_readable() -> None:
    assert md.text("correction.is_level") == "correction.is_level"
    assert md.text("pool=sim-a100 (3/3 @ 81)") == "pool=sim-a100 (3/3 @ 81)"


@pytest.mark.parametrize("value", ["plain", "a`b", "``x``", "`edge`"])
def test_code_span_cannot_be_closed_from_inside(value: str) -> None:
    out = md.code(value)
    fence = out[: len(out) - len(out.lstrip("`"))]
    inner = out[len(fence):-len(fence)]
    assert out.endswith(fence) and fence not in inner.strip()
    assert inner.strip() == value
