"""Alerts: the grid's ``notify:`` webhooks, told of collapses, warnings, infra failures,
rescues, an exhausted budget and the grid's end, without ever holding the grid up.

Events come from the trial files (the runners write them in Ray workers): ``scan`` reads each
trial's ``state.json`` (and ``warning.json``, which a runner writes the step a warning fires, so
that alert goes out while the trial runs) and queues what it finds, one event per trial and kind (a rescue: one per
rescue note), in an outbox in the grid's directory (``notify/``, one atomic JSON file per event
and webhook). A file that exists is never queued again, so a re-submission sends nothing twice.
A background thread sends what is due: one POST per event with a JSON body (Slack's ``text``
plus the fields a script reads), at most one per ``min_interval_s`` per webhook, retried with
exponential backoff up to ``max_tries``, then kept as failed with the reason. ``close`` gives
the last events ``drain_s`` seconds and returns: a slow or dead receiver costs the grid at
most that, and what was not sent stays pending for the next submission.

The URL is read from the webhook's environment variable at each send and is not written
anywhere; an error text that would repeat it has it replaced by the variable's name.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import UserError
from orchestrator.grid import check_notify, load_grid, notes, redact_url, webhook_url
from orchestrator.store import TrialPaths, atomic_write_json, read_json, records

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
    from orchestrator.schema import NotifySpec

log = logging.getLogger(__name__)
TICK_S = 1.0  # how often the thread looks for events and sends what is due
MAX_BACKOFF_S = 300.0


class Notifier:
    """The outbox of one grid's webhooks and the thread that empties it."""

    def __init__(self, grid: GridSpec, grid_dir: Path) -> None:
        self.grid, self.hooks = grid, list(grid.spec.notify)
        self.dir = Path(grid_dir) / "notify"
        self.grid_dir = Path(grid_dir)
        self._seen: set[str] = set()  # outbox keys known to exist (not read again)
        self._last_sent: dict[int, float] = {}
        self._stop = threading.Event()
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ queueing

    def queue(self, event: str, fields: dict[str, Any], key: str) -> None:
        """Queue ``event`` for every webhook that wants it, once per ``key`` (ever)."""
        for i, hook in enumerate(self.hooks):
            if event not in hook.events:
                continue
            name = f"{i}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
            if name in self._seen:
                continue
            self._seen.add(name)
            path = self.dir / name
            if path.exists():
                continue
            self.dir.mkdir(parents=True, exist_ok=True)
            body = {"text": _text(self.grid.name, event, fields), "event": event,
                    "grid": self.grid.name, **fields}
            atomic_write_json(path, {"hook": i, "key": key, "state": "pending", "tries": 0,
                                     "next_at": 0.0, "error": None, "body": body})

    def grid_end(self, summary: dict[str, Any], *, budget_out: bool, submission: str) -> None:
        """The grid-level alerts of a submission's end: its budget ran out, the grid is done."""
        if budget_out:
            self.queue("budget_exhausted", {"reason": "the grid's budget is spent: trials were "
                       "not started; raise it and submit again"}, f"budget_exhausted:{submission}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("states", {}).items()))
        self.queue("grid_done", {"reason": counts, "states": summary.get("states"),
                                 "rescued": summary.get("rescued")}, f"grid_done:{submission}")

    def scan(self) -> None:
        """Queue the events the trial files hold now."""
        for tid, spec in records.known_trials(self.grid_dir).items():
            paths = TrialPaths(self.grid_dir, tid)
            rec = records.load_state(paths, tid)
            base = {"trial_id": tid, "pool": rec.pool or spec.pool,
                    "cell": ", ".join(f"{k}={v}" for k, v in spec.axes) or spec.pool,
                    "mlflow_run_id": rec.mlflow_run_id}
            v = rec.verdict or {}
            if rec.state.value == "failed":
                self.queue("infra_failed", {**base, "verdict": v.get("kind"), "step": rec.last_step,
                                            "reason": rec.error or v.get("reason")}, f"infra_failed:{tid}")
            if v.get("kind") in ("collapsed", "numeric_failure"):
                self.queue("collapsed", {**base, "verdict": v["kind"], "step": v.get("step"),
                                         "reason": v.get("reason")}, f"collapsed:{tid}")
            # A warning as it fires (the runner's ``warning.json``), or, for a trial that ran
            # before the file existed, from its verdict at the end: one key, sent once.
            told = _told(paths)
            warned = v.get("rescued_step", v.get("warning_step"))
            if told is not None:
                self.queue("warning", {**base, "verdict": v.get("kind") or "running",
                                       "step": told.get("step"), "rule": told.get("rule"),
                                       "reason": told.get("reason")}, f"warning:{tid}")
            elif warned is not None:
                self.queue("warning", {**base, "verdict": v.get("kind"), "step": warned,
                                       "reason": v.get("reason")}, f"warning:{tid}")
            for n, note in enumerate(notes(rec)):
                extra = {**base, "verdict": v.get("kind"), "step": note.get("step"),
                         "rescue": {k: note.get(k) for k in ("event", "by", "trial", "pool", "start")}}
                # The event a rescue acted on, which a rescue in place may have cleared from
                # the record before a scan saw it (same key: sent once either way).
                kind = str(note.get("event", "collapsed")).partition(":")[0]
                self.queue(kind, {**extra, "reason": f"{note.get('by')} rescues it"}, f"{kind}:{tid}")
                if note.get("refused") == "budget":
                    self.queue("budget_exhausted", {**extra, "reason": note.get("error")},
                               f"budget_exhausted:{tid}:{n}")
                elif not note.get("error"):
                    self.queue("rescued", {**extra, "reason": f"{note.get('by')} on {note.get('event')}"},
                               f"rescued:{tid}:{n}")

    # ------------------------------------------------------------------ sending

    def send_due(self) -> None:
        """One pass over the outbox: send what is due, within each webhook's rate limit."""
        if not self.dir.exists():
            return
        for path in sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime):
            if self._stop.is_set() and self._past_deadline():
                return
            item = read_json(path)
            i = int(item["hook"])
            if item["state"] != "pending" or item["next_at"] > time.time() or i >= len(self.hooks):
                continue
            hook = self.hooks[i]
            if time.monotonic() - self._last_sent.get(i, -1e9) < float(hook.min_interval_s):
                continue
            self._last_sent[i] = time.monotonic()
            error, final = post(hook, item["body"])
            item["tries"] += 1
            if error is None:
                item.update(state="sent", error=None, sent_at=time.time())
            else:
                gave_up = final or item["tries"] >= hook.max_tries
                item.update(state="failed" if gave_up else "pending", error=error,
                            next_at=time.time() + min(MAX_BACKOFF_S, 2.0 ** item["tries"]))
                log.warning("notify[%d] (%s): %s not delivered (try %d): %s", i, hook.url_env,
                            item["key"], item["tries"], error)
            atomic_write_json(path, item)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline

    def _loop(self) -> None:
        while not (self._stop.is_set() and (self._past_deadline() or not self._pending_due())):
            try:
                self.scan()
                self.send_due()
            except Exception as exc:  # noqa: BLE001 - an alert never fails the grid
                log.warning("notify: %s", str(exc)[:300])
            if not self._stop.is_set():
                self._stop.wait(TICK_S)

    def _pending_due(self) -> bool:
        now = time.time()
        for p in self.dir.glob("*.json") if self.dir.exists() else ():
            item = read_json(p)
            if item["state"] == "pending" and item["next_at"] <= now:
                return True
        return False

    def start(self) -> None:
        if self.hooks and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ablate-notify", daemon=True)
            self._thread.start()

    def close(self, drain_s: float = 5.0) -> None:
        """Scan once more, give what is due ``drain_s`` seconds, and return (bounded)."""
        if self._thread is None:
            return
        self._deadline = time.monotonic() + drain_s
        self._stop.set()
        self._thread.join(timeout=drain_s + 0.5)


def _told(paths: TrialPaths) -> dict[str, Any] | None:
    """The trial's ``warning.json`` (its runner's first warning), or None: none yet, or not
    readable (told at the trial's end from its verdict instead)."""
    try:
        return read_json(paths.warning)
    except (OSError, ValueError):  # FileNotFoundError: no warning yet
        return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is not followed: urllib would re-send the POST as a body-less GET to
    wherever it points, another host included, and a 200 there would read as delivered."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(hook: NotifySpec, body: dict[str, Any]) -> tuple[str | None, bool]:
    """POST ``body`` to the webhook: (error or None, whether retrying is pointless). An error
    never holds the URL (``redact_url``); a redirect is a failed delivery, given up at once."""
    url = webhook_url(hook)
    if url is None:
        return f"{hook.url_env} is unset or not a deliverable http(s) URL", False
    req = urllib.request.Request(url, data=json.dumps(body, default=str).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=float(hook.timeout_s)) as resp:
            resp.read(1024)
        return None, False
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            return (f"HTTP {exc.code}: the receiver redirects, which is not followed (the alert "
                    f"would arrive as a body-less GET elsewhere); fix: set {hook.url_env} to the "
                    "URL it redirects to"), True
        return f"HTTP {exc.code}", 400 <= exc.code < 500 and exc.code not in (408, 429)
    except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, DNS: all retried
        return redact_url(str(exc), url, hook.url_env)[:300], False


def _text(grid: str, event: str, f: dict[str, Any]) -> str:
    """Slack's ``text``: one line a person reads in a channel."""
    if event == "grid_done":
        return f"[{grid}] grid done: {f.get('reason', '')}"
    where = f"trial {f.get('trial_id')} ({f.get('cell')}) on {f.get('pool')}"
    step = "" if f.get("step") is None else f" at step {f.get('step')}"
    return f"[{grid}] {event.replace('_', ' ')}: {where}{step}: {str(f.get('reason') or '')[:300]}"


def notify_test(grid_path: str) -> list[tuple[str, str | None]]:
    """``ablate notify-test``: one test event to every webhook of the grid, now; (webhook,
    error or None) each. A grid without ``notify:`` or a bad variable is a user error."""
    grid = load_grid(grid_path)
    if not grid.spec.notify:
        raise UserError(f"{grid.file}: notify: the grid has no webhooks; fix: add e.g. "
                        "'notify: [{url_env: ABLATE_WEBHOOK}]' and export ABLATE_WEBHOOK")
    check_notify(grid)
    out = []
    for i, hook in enumerate(grid.spec.notify):
        body = {"text": f"[{grid.name}] rl-ablate notify-test: this webhook receives the grid's "
                        f"alerts ({', '.join(hook.events)})", "event": "test", "grid": grid.name}
        out.append((f"notify[{i}] ({hook.url_env})", post(hook, body)[0]))
    return out
