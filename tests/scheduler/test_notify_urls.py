"""Webhook URLs (issue 59, items 4 and 5): one validator at plan and at every send, one
redaction wherever a URL could appear, and a redirect is a failed delivery, not ``sent``.
Loopback receivers only; about 1 s in all."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.grid import load_grid, redact_url
from orchestrator.scheduler._notify import Notifier, post
from orchestrator.store import workspace

HOOK = "ABLATE_TEST_WEBHOOK"
GRID = """\
name: urls
recipe: sim/grpo_tiny
backend: sim
steps: 4
pool: sim-a100
notify:
  - {url_env: ABLATE_TEST_WEBHOOK, min_interval_s: 0, max_tries: 5}
"""


def _grid(tmp: Path) -> Path:
    path = tmp / "urls.yaml"
    path.write_text(GRID)
    return path


def _files_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:9/hooks/T0KEN\x1b]0;x\x07", "holds a control character"),
    ("http://127.0.0.1:9/hooks/T0KEN\n", None),  # a trailing newline is stripped: valid
    ("https://hooks.example.org/T0KEN\x9d", "holds a control character"),
    ("http://alice:T0KEN@127.0.0.1:9/hook", "holds credentials (user:password@"),
    ("http://[::1/T0KEN", "is not a well-formed URL"),
    ("http://127.0.0.1:T0KEN/x", "is not a well-formed URL"),
])
def test_a_webhook_url_that_cannot_be_delivered_is_refused_at_plan_without_repeating_it(
        isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        url: str, why: str | None) -> None:
    monkeypatch.setenv(HOOK, url)
    rc = main(["plan", str(_grid(isolated))])
    out, err = capsys.readouterr()
    if why is None:
        assert rc == 0, err
        return
    assert rc == 2 and err.count("\n") == 1 and why in err and "; fix: " in err, err
    assert "T0KEN" not in err + out and "Traceback" not in err and "\x1b" not in err
    assert not (isolated / ".ablate").exists()


def test_a_url_made_undeliverable_after_plan_is_written_nowhere(
        isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is read at each send: one changed to a URL with credentials after plan
    fails the send with the variable's name, and no file of the grid holds the URL."""
    grid = load_grid(_grid(isolated))
    monkeypatch.setenv(HOOK, "http://alice:T0KEN@127.0.0.1:9/hook")
    grid_dir = workspace.grid_dir(grid.name)
    n = Notifier(grid, grid_dir)
    n.queue("grid_done", {"reason": "1 trials"}, "grid_done")
    n.send_due()
    (item,) = [json.loads(p.read_text()) for p in (grid_dir / "notify").glob("*.json")]
    assert item["state"] == "pending" and HOOK in item["error"]
    assert "T0KEN" not in _files_text(isolated) and "alice" not in _files_text(isolated)


def test_one_redaction_covers_every_form_of_the_url() -> None:
    url = "https://hooks.example.org/services/T0KEN%2Fpart?sig=S1GNATURE"
    texts = [f"<urlopen error {url!r}>", "bad path /services/T0KEN/part?sig=S1GNATURE",
             "host hooks.example.org refused", "query sig=S1GNATURE only"]
    for text in texts:
        out = redact_url(text, url, HOOK)
        assert "T0KEN" not in out and "S1GNATURE" not in out and "hooks.example" not in out, out
        assert f"${HOOK}" in out


class _Redirecting:
    """A receiver answering every POST with 302 to a second loopback server, which records
    any request it gets (urllib would follow as a body-less GET)."""

    def __init__(self, code: int) -> None:
        self.followed: list[str] = []
        outer = self

        class Target(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.followed.append("GET")
                self.send_response(200)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.target = ThreadingHTTPServer(("127.0.0.1", 0), Target)
        where = f"http://127.0.0.1:{self.target.server_port}/elsewhere"

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(code)
                self.send_header("Location", where)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        self.url = f"http://127.0.0.1:{self.hook.server_port}/hooks/T0KEN"
        for server in (self.target, self.hook):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.target, self.hook):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("code", [302, 307])
def test_a_redirect_is_a_failed_delivery_with_the_reason_not_sent(
        isolated: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    receiver = _Redirecting(code)
    try:
        monkeypatch.setenv(HOOK, receiver.url)
        grid = load_grid(_grid(isolated))
        grid_dir = workspace.grid_dir(grid.name)
        n = Notifier(grid, grid_dir)
        n.queue("grid_done", {"reason": "1 trials"}, "grid_done")
        n.send_due()
        (item,) = [json.loads(p.read_text()) for p in (grid_dir / "notify").glob("*.json")]
        assert item["state"] == "failed" and item["tries"] == 1, item
        assert item["error"].startswith(f"HTTP {code}: the receiver redirects") and HOOK in item["error"]
        assert receiver.followed == [] and "T0KEN" not in _files_text(isolated)
        error, final = post(grid.spec.notify[0], {"text": "x"})
        assert final and error is not None and "T0KEN" not in error
    finally:
        receiver.close()
