"""What a submission does to the trial records around a Tune fit (``_submission``): before it,
each trial's spec written and its files checked and reset (``prepare_records``), trials of a
pool without capacity, or of a configuration a preflight gate skipped, parked with the reason
(``park``); after it, the trials Tune
gave up on marked failed, on disk and in MLflow (``mark_exhausted``).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import ConcurrencyError, GateFailed
from orchestrator.scheduler._placement import Placement
from orchestrator.store import TrialPaths, atomic_write_json, records
from orchestrator.tracking import client
from orchestrator.trial import TrialSpec, TrialState, transition

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

log = logging.getLogger(__name__)


def prepare_records(grid_dir: Path, trials: list[TrialSpec],
                     repair: Callable[[TrialPaths, records.TrialRecord], None] | None = None,
                     ) -> tuple[list[TrialSpec], list[str]]:
    """Write the spec of each trial, check its files (``repair`` its metrics file) and reset
    trials left RUNNING by a dead orchestrator. Returns the trials to run and the finished ones
    (whose outboxes the sender still sends)."""
    todo, finished = [], []
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        records.save_spec(paths, t)
        if not paths.state.exists():  # a new trial: pending on its own pool, nothing to reset
            todo.append(t)
            continue
        with quiet_trial(paths, t.trial_id):
            rec = records.load_state(paths, t.trial_id)
            records.load_attempts(paths)  # a corrupt file stops the submit here, not in a Ray worker
            if repair is not None:
                repair(paths, rec)  # may reopen a finished trial to recompute what its file lost
            if rec.state.is_finished():
                finished.append(t.trial_id)
                continue
            if rec.state is TrialState.RUNNING or rec.pending_reason:
                if rec.state is TrialState.RUNNING:  # its orchestrator died; the runner resumes it
                    rec.state = transition(rec.state, TrialState.PENDING)
                rec.pending_reason = None
                rec.pool = rec.pool or t.pool
                records.save_state(paths, rec)
        todo.append(t)
    return todo, finished


ORPHAN_WAIT_S = 60.0  # how long a submission waits for a dead orchestrator's worker to go


@contextlib.contextmanager
def quiet_trial(paths: TrialPaths, trial_id: str) -> Iterator[None]:
    """Hold the trial's run lock while its files are read and reset. A worker of an orchestrator
    that was just killed can still be finishing an attempt (Ray stops a dead driver's workers
    within seconds): its last writes land before the state is judged, never after."""
    from filelock import Timeout

    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=ORPHAN_WAIT_S)
    except Timeout:
        raise ConcurrencyError(f"trial {trial_id} is still run by another process ({paths.run_lock} "
                               f"held for {ORPHAN_WAIT_S:.0f} s); stop that process or wait for "
                               f"it, then submit again") from None
    try:
        yield
    finally:
        lock.release()


def park_unplaceable(grid_dir: Path, todo: list[TrialSpec], placements: Mapping[str, Placement],
                      routes: Mapping[str, str]) -> list[TrialSpec]:
    """Trials whose pool has no capacity stay PENDING with the reason, instead of hanging Tune."""
    return park(grid_dir, todo, lambda t: placements[routes.get(t.trial_id, t.pool)].reason)


def park(grid_dir: Path, todo: list[TrialSpec],
         reason: Callable[[TrialSpec], str | None]) -> list[TrialSpec]:
    """The trials of ``todo`` with no ``reason`` not to start; the others stay PENDING with it
    in their records (``not started: ...``, what status, resume and the summary show)."""
    runnable = []
    for t in todo:
        why = reason(t)
        if why is None:
            runnable.append(t)
            continue
        paths = TrialPaths(grid_dir, t.trial_id)
        rec = records.load_state(paths, t.trial_id)
        rec.pending_reason = "not started: " + why
        records.save_state(paths, rec)
    return runnable


def remember_point(grid_dir: Path, trial: TrialSpec, stored: dict[str, Any]) -> None:
    """A new search point's trial (the gate calls it): its spec and the point in its state."""
    paths = TrialPaths(grid_dir, trial.trial_id)
    records.save_spec(paths, trial)
    rec = records.load_state(paths, trial.trial_id)
    rec.search, rec.pool = stored, trial.pool
    records.save_state(paths, rec)


def mark_exhausted(grid_dir: Path, trial_ids: set[str], tracking_uri: str) -> None:
    """Trials Tune gave up on (retries.max infra failures) end FAILED with their last error,
    on disk and in MLflow (their runs would otherwise stay RUNNING there)."""
    for tid in trial_ids:
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        if rec.state.is_finished():
            continue
        attempts = records.load_attempts(paths)
        reason = (attempts[-1].reason if attempts else None) or rec.error or "infra failure"
        rec.state = transition(rec.state, TrialState.FAILED)
        rec.error = f"retries exhausted after {len(attempts)} attempts: {reason}"
        rec.verdict = {"kind": "infra_failure", "step": rec.last_step, "reason": rec.error}
        records.save_state(paths, rec)
        if rec.mlflow_run_id:
            try:
                mlc = client(tracking_uri)
                for key, value in (("verdict", "infra_failure"), ("verdict.reason", rec.error[:4000]),
                                   ("verdict.step", str(rec.last_step))):
                    mlc.set_tag(rec.mlflow_run_id, key, value)
                mlc.set_terminated(rec.mlflow_run_id, "FAILED")
            except Exception as exc:  # noqa: BLE001 - the record on disk is what counts
                log.warning("trial %s: MLflow not updated: %s", tid, exc)


def preflight_skips(grid: GridSpec, grid_dir: Path, *, workdir: str | None,
                    tracking_uri: str | None) -> dict[str, str]:
    """The grid's ``preflight:`` probe, before any trial starts: its report in the grid's
    ``preflight/`` folder and ``preflight.json``, its lines on stderr; the trials it skips
    (``on_fail: skip``) with why. A refusal raises ``GateFailed`` (exit 1)."""
    from orchestrator.probe import preflight  # deferred: the probe's jobs import their trainers

    try:
        done = preflight(grid, grid_dir / "preflight", workdir=workdir, tracking_uri=tracking_uri)
    except GateFailed as exc:
        atomic_write_json(grid_dir / "preflight.json", {"refused": exc.lines})
        raise
    if done is None:
        return {}
    atomic_write_json(grid_dir / "preflight.json", done.record())
    print(*done.lines(), sep="\n", file=sys.stderr, flush=True)
    return done.skipped
