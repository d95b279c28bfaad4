"""The ``notify:`` webhooks checked before a grid runs: each names an environment variable
that must hold an http(s) URL. The value is read, never shown: a webhook URL is a secret
(Slack's carries its token), so no message, record or log repeats it.

Checked by ``ablate plan``, ``ablate submit`` and ``ablate notify-test``, not by ``load_grid``:
``ablate status`` and ``ablate compare`` of a grid run elsewhere need no webhook.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import format_path
from orchestrator.schema import NotifySpec

if TYPE_CHECKING:
    from orchestrator.grid._spec import GridSpec


# A character a URL never holds raw: the C0 and C1 controls, space and DEL (an ESC or a newline from
# ``export X=$(cat file)`` would reach the request line or a terminal).
_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f]")


def url_problem(value: str) -> tuple[str, str] | None:
    """(why, fix) when ``value`` is not a webhook URL this tool can deliver to, never repeating
    it (it may hold a token), or None. The one check of a webhook URL: at plan and at every send."""
    if _CONTROL.search(value):
        return "holds a control character or a space", "remove it (URL-encode a space as %20)"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a port that does not parse raises here
    except ValueError:
        return ("is not a well-formed URL (a bracket or a port that does not parse)",
                "give the receiver's full http:// or https:// URL")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "does not hold an http(s) URL", "give the receiver's full http:// or https:// URL"
    if parts.username is not None or parts.password is not None:
        why = ("holds credentials (user:password@ before the host), which are never sent: "
               "urllib sends no authorization from a URL, so every alert would fail")
        fix = ("use the receiver's token URL (the secret in its path or query, as Slack's and "
               "Discord's webhooks carry it), which stays in the variable")
        return why, fix
    return None


def webhook_url(spec: NotifySpec, environ: Mapping[str, str] | None = None) -> str | None:
    """The webhook's URL from its variable, or None when unset or not a deliverable URL."""
    value = (os.environ if environ is None else environ).get(spec.url_env, "").strip()
    return value if value and url_problem(value) is None else None


def redact_url(text: str, url: str | None, name: str) -> str:
    """``text`` with every form of ``url`` (whole, quoted, percent-decoded, and its host with
    credentials, path and query) replaced by ``$name``: the one redaction of a webhook URL in
    error texts, logs and printed messages."""
    if not url:
        return text
    parts = urlsplit(url) if url_problem(url) is None else None
    pieces = {url, url.strip(), unquote(url), repr(url)[1:-1], quote(url, safe=":/")}
    if parts is not None:
        pieces |= {parts.netloc, parts.path, parts.query, unquote(parts.path),
                   unquote(parts.query), parts.path + ("?" + parts.query if parts.query else "")}
    for piece in sorted((p for p in pieces if len(p) >= 4), key=len, reverse=True):
        text = text.replace(piece, f"${name}")
    return text


def check_notify(grid: GridSpec) -> None:
    """Every webhook's variable holds a URL alerts can be delivered to (a one-line
    ``GridError`` naming the variable and the fix if not, never the value)."""
    for i, spec in enumerate(grid.spec.notify):
        path = ("notify", i, "url_env")
        line = next((grid.lines[p] for p in (path, path[:2], path[:1]) if p in grid.lines), None)
        where = {"file": grid.file, "line": line, "key": format_path(path)}
        value = os.environ.get(spec.url_env, "").strip()
        if not value:
            raise GridError(f"environment variable {spec.url_env} is not set", **where,
                            fix=f"export {spec.url_env} with the webhook's URL before running the grid")
        problem = url_problem(value)
        if problem is not None:  # the value is not repeated: it may hold a token
            why, fix = problem
            raise GridError(f"environment variable {spec.url_env} {why}", **where,
                            fix=f"{fix} in {spec.url_env}")
