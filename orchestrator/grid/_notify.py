"""The ``notify:`` webhooks checked before a grid runs: each names an environment variable
that must hold an http(s) URL. The value is read, never shown: a webhook URL is a secret
(Slack's carries its token), so no message, record or log repeats it.

Checked by ``ablate plan``, ``ablate submit`` and ``ablate notify-test``, not by ``load_grid``:
``ablate status`` and ``ablate compare`` of a grid run elsewhere need no webhook.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import format_path
from orchestrator.schema import NotifySpec

if TYPE_CHECKING:
    from orchestrator.grid._spec import GridSpec


def webhook_url(spec: NotifySpec, environ: Mapping[str, str] | None = None) -> str | None:
    """The webhook's URL from its variable, or None when unset or not an http(s) URL."""
    value = (os.environ if environ is None else environ).get(spec.url_env, "").strip()
    parts = urlsplit(value)
    return value if parts.scheme in ("http", "https") and parts.netloc else None


def check_notify(grid: GridSpec) -> None:
    """Every webhook's variable is set to an http(s) URL (a one-line ``GridError`` if not)."""
    for i, spec in enumerate(grid.spec.notify):
        path = ("notify", i, "url_env")
        line = next((grid.lines[p] for p in (path, path[:2], path[:1]) if p in grid.lines), None)
        where = {"file": grid.file, "line": line, "key": format_path(path)}
        if not os.environ.get(spec.url_env, "").strip():
            raise GridError(f"environment variable {spec.url_env} is not set", **where,
                            fix=f"export {spec.url_env} with the webhook's URL before running the grid")
        if webhook_url(spec) is None:  # the value is not repeated: it may hold a token
            raise GridError(f"environment variable {spec.url_env} does not hold an http(s) URL", **where,
                            fix=f"set {spec.url_env} to the webhook's http:// or https:// URL")
