"""The orchestrator side of deferred tracking: a submission's ``Sender`` thread opens the
parent run beside Ray's start-up, then sends the outbox of each trial whose attempts are over
(``send_trial``) and records the run id in its ``state.json`` (why attempts defer: ``_deferred``).

One writer at a time per outbox: the worker while attempts run, the sender only once Tune has
given up on the trial for this submission (its ``on_trial_complete``/``on_trial_error`` callback,
which a retried failure does not trigger), or for a trial an earlier orchestrator left finished.
The trial's run lock enforces it: the runner holds it for a whole attempt, the sender while it
sends (a killed orchestrator's worker can outlive its driver by a few seconds).
Crash safety is the outbox's: a SIGKILLed orchestrator leaves the outboxes on disk; the next
submission sends those of finished trials, and an unfinished trial's next attempt continues its
outbox (committed rows stay there, so nothing is sent twice or lost).
"""
from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.metrics import EVAL_REWARD_REF
from orchestrator.store import TrialPaths, records
from orchestrator.store.reference import read_reference, send_reference
from orchestrator.tracking._deferred import DeferredRun
from orchestrator.tracking._grid_run import GridRun, TrackingTarget
from orchestrator.tracking._outbox import Outbox
from orchestrator.tracking._runs import TrialRun, drain
from orchestrator.tracking._store import log_steps
from orchestrator.trial import TrialState
from orchestrator.verdict import Verdict

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

log = logging.getLogger(__name__)


def send_trial(grid: GridSpec, grid_dir: Path, trial_id: str, target: TrackingTarget,
               timeout: float = 30) -> bool:
    """Send what trial ``trial_id`` owes MLflow (creating its run if a deferred attempt never
    did) and record the run id in its ``state.json``. True when nothing is left to send.

    Runs under the trial's run lock: a worker of a killed orchestrator may still be ending the
    attempt, and its outbox has one writer at a time. A lock held past ``timeout`` leaves the
    outbox for the next submission."""
    from filelock import Timeout

    paths = TrialPaths(grid_dir, trial_id)
    buf = paths.outbox
    if not buf.is_dir():
        return True
    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        log.warning("trial %s: %s held for %.0f s; its MLflow outbox stays for the next submission",
                    trial_id, paths.run_lock, timeout)
        return False
    try:
        return _send_locked(grid, paths, trial_id, buf, target, timeout)
    finally:
        lock.release()


def _send_locked(grid: GridSpec, paths: TrialPaths, trial_id: str, buf: Path,
                 target: TrackingTarget, timeout: float) -> bool:
    outbox = Outbox(buf)
    rec = records.load_state(paths, trial_id)
    if rec.state.is_finished() and outbox.end_status is None:
        _close_from_records(paths, rec, buf)
        outbox = Outbox(buf)
    ok = True
    if outbox.run_id is None:
        spec = records.load_spec(paths)
        if spec is None:
            return outbox.empty()
        run = TrialRun(target.uri, target.experiment_id, target.parent_run_id, spec,
                       grid.pools.get(rec.pool or spec.pool), run_id=None, buffer_dir=buf)
        ok = run.flush(timeout)
    elif not outbox.empty():
        ok = drain(buf, target.uri, timeout)
    # Also when the outbox was already empty: a sender killed after the last send but before
    # this write left the run id only in the outbox.
    run_id = Outbox(buf).run_id
    if run_id is not None and rec.mlflow_run_id != run_id:
        rec.mlflow_run_id = run_id
        records.save_state(paths, rec)
    # Reference scores the runner made at the trial's checkpoints (verl) and could not send
    # itself (a deferred attempt): the outbox takes rows in step order only.
    held = read_reference(paths)
    if held is not None and ok:
        ok = not send_reference(paths, held, run_id, lambda run, values: log_steps(
            target.uri, run, EVAL_REWARD_REF, values))
    return ok


_END_STATUS = {TrialState.DONE: "FINISHED", TrialState.FAILED: "FAILED", TrialState.CANCELLED: "KILLED"}


def _close_from_records(paths: TrialPaths, rec: records.TrialRecord, buf: Path) -> None:
    """A finished trial whose outbox was never closed: its runner died after saving the trial's
    end but before giving the outbox the verdict, the attempts and the end status (a killed
    orchestrator's worker, stopped by Ray mid-way). They are in the trial's records: add them,
    so the run is not left RUNNING without a verdict."""
    spec = records.load_spec(paths)
    if spec is None:
        return
    run = DeferredRun(spec, buf)
    if rec.verdict:
        try:
            run.set_verdict(Verdict.from_json(rec.verdict))
        except (KeyError, TypeError, ValueError):
            log.warning("trial %s: verdict in state.json not readable; sent without it", rec.trial_id)
    attempts = records.load_attempts(paths)
    if attempts:
        run.log_attempts(attempts)
    run.end(_END_STATUS[rec.state])


class Sender:
    """Background thread of one submission: opens the parent run, then sends trials' outboxes.

    Opening the parent run (``import mlflow``, the store's schema) overlaps Ray's and Tune's
    start-up instead of preceding it; an unreachable store still stops the submission (the Tune
    callback raises ``error`` on its next step).
    """

    def __init__(self, grid: GridSpec, grid_dir: Path, tracking_uri: str, root: Path) -> None:
        self.grid, self.grid_dir, self.tracking_uri, self.root = grid, Path(grid_dir), tracking_uri, root
        self.parent: GridRun | None = None
        self.target: TrackingTarget | None = None  # set with the parent run, by the thread
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="ablate-sender", daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            self.parent = GridRun.open(self.grid, tracking_uri=self.tracking_uri, workdir=self.root)
            self.target = self.parent.target
        except BaseException as exc:  # noqa: BLE001 - handed to the driver thread by wait()
            self.error = exc
            return
        finally:
            self._ready.set()
        while (tid := self._queue.get()) is not None:
            try:
                send_trial(self.grid, self.grid_dir, tid, self.target)
            except OSError as exc:  # e.g. a full disk: the submission stops with one line
                log.warning("trial %s: MLflow outbox not sent: %s", tid, exc)
            except Exception:  # the outbox keeps it; the next submission sends it
                log.exception("trial %s: MLflow outbox not sent", tid)
            finally:
                self._queue.task_done()

    def ready_target(self) -> TrackingTarget | None:
        """The tracking target once the parent run is open (None before: attempts defer)."""
        return self.target if self._ready.is_set() else None

    def send(self, trial_id: str) -> None:
        """Queue a trial whose attempts are over (for this submission)."""
        self._queue.put(trial_id)

    def wait(self) -> GridRun:
        """The parent GridRun; raises what opening it raised."""
        self._ready.wait()
        if self.error is not None:
            raise self.error
        assert self.parent is not None
        return self.parent

    def drain(self) -> None:
        """Block until every queued trial is sent (or kept in its outbox after an outage)."""
        self.wait()
        self._queue.join()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=60)
