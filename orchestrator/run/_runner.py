"""Runs ONE attempt of one trial, anywhere: inside a Ray Tune worker or directly in this process.

The runner owns everything above the backend: the trial's files (``store.records``), the checkpoint
store, the verdict engine, the MLflow child run and the attempt record (the state of one running
attempt is ``_attempt.AttemptRun``; this module locks, runs and ends it). Its central rule is
**commit on checkpoint**: every step goes to ``metrics.jsonl`` at once, but to MLflow only up to
the last saved checkpoint (and everything at the end). A later attempt resumes from a checkpoint
at step K and truncates the local file to K, so MLflow never sees a step twice and never misses
one. A commit cut short by a crash is simply sent again: the tracking outbox keeps the last step
it holds and drops anything at or below it. When MLflow already holds steps after K (``ablate
resume`` from an earlier checkpoint), the child run is replaced by a fresh one refilled from the
local file (``orchestrator/scheduler/_resume.py`` explains why); the replaced rows are kept in
``superseded/attempt-N.jsonl`` and as an artifact.
With ``tracking: {every: N}`` a commit sends MLflow only a share of its rows (every N-th step,
the commit's last step, the steps the verdict can name: ``_commits.AttemptCommits.commit``);
``metrics.jsonl`` still holds every step.

Infra failures (exceptions, a killed worker) are recorded as an attempt and re-raised so Ray Tune
retries the trial; collapse and numeric failure are results and return normally.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import backends
from orchestrator.exceptions import CheckpointError, InfraFailure, UserError, no_such_trial
from orchestrator.grid import expand, load_grid
from orchestrator.run._attempt import AttemptContext, AttemptRun
from orchestrator.run._state import AttemptJob
from orchestrator.store import TrialPaths, atomic_write_json, records, workspace
from orchestrator.store.records import mark_cancelled, stored_result
from orchestrator.store.workspace import scoped_environ
from orchestrator.tracking import TrackingTarget, parent_run
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec


def run_attempt(job: AttemptJob) -> dict[str, Any]:
    """Run one attempt of ``job.trial`` under its per-trial lock; see the module docstring.

    Returns the result dict (also written to ``result.json``). Raises on infra failure after
    recording it; a finished trial (unless ``job.reopen``) returns its stored result at once.
    """
    from filelock import Timeout

    paths = TrialPaths(Path(job.grid_dir), job.trial.trial_id)
    records.save_spec(paths, job.trial)
    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=job.lock_timeout)
    except Timeout:
        raise InfraFailure(f"trial {job.trial.trial_id} is still running in another process "
                           f"(lock {paths.run_lock} held for {job.lock_timeout:.0f} s)") from None
    try:
        return _run_locked(job, paths)
    finally:
        lock.release()


def _run_locked(job: AttemptJob, paths: TrialPaths) -> dict[str, Any]:
    record = records.load_state(paths, job.trial.trial_id)
    if record.state.is_finished() and not job.reopen:
        return stored_result(paths, record)
    if job.trial.trial_id in records.cancel_requests(Path(job.grid_dir)) and not job.reopen:
        return mark_cancelled(Path(job.grid_dir), job.trial.trial_id)
    attempt = AttemptRun(job)
    try:
        t0 = time.perf_counter()
        attempt.prepare()
        t1 = time.perf_counter()
        result = job.backend_ref.run(job.trial, job.config, AttemptContext(attempt))
        attempt.timing = {"prepare_s": t1 - t0, "run_s": time.perf_counter() - t1}
    except (UserError, CheckpointError) as exc:
        if not attempt.started:
            raise  # refused before anything was recorded (e.g. an explicit bad resume step)
        attempt.fail(exc, retriable=False)  # a bad config or checkpoint fails the same way again
        return stored_result(paths, records.load_state(paths, job.trial.trial_id))
    except BaseException as exc:
        if attempt.started:
            attempt.fail(exc, retriable=True)
        raise
    t2 = time.perf_counter()
    out = attempt.finish(result)
    # Orchestration cost of this attempt, outside the backend's own work (kept in result.json).
    out["timing"] = {**attempt.timing, "finish_s": time.perf_counter() - t2}
    atomic_write_json(paths.result, out)
    return out


def run_single(grid_path: str, trial_id: str, *, workdir: str | None = None,
               tracking_uri: str | None = None, fresh: bool = False) -> dict[str, Any]:
    """Run one trial of a grid in this process, without Ray (``ablate run-trial``)."""
    grid = load_grid(grid_path)
    trials = {t.trial_id: t for t in expand(grid, force=True)}
    if trial_id not in trials:
        raise no_such_trial(trial_id, trials, where=grid_path, scope=f" in grid {grid.name}",
                            see="see `ablate plan` for ids")
    trial = trials[trial_id]
    # Before anything is written.
    backends.backend(trial.backend).require([grid.pools.get(trial.pool)],
                                            where=f"{grid.file}: pool")
    grid_dir = workspace.grid_dir(grid.name, workdir)
    uri = workspace.tracking_uri(tracking_uri, workdir)
    with parent_run(grid, tracking_uri=uri, workdir=workspace.workdir(workdir)) as target:
        job = make_job(grid, trial, grid_dir=grid_dir, tracking=target,
                       submission=f"run-trial-{os.getpid()}-{int(time.time())}",
                       start="fresh" if fresh else "latest", reopen=fresh)
        # Effective only if nothing imported torch yet (the CLI has not); the trial records
        # what it really ran under either way.
        with scoped_environ(backends.backend(trial.backend).worker_env(job.config)):
            return run_attempt(job)


def make_job(grid: GridSpec, trial: TrialSpec, *, grid_dir: Path, tracking: TrackingTarget | None,
             submission: str, start: str | int = "latest", reopen: bool = False,
             pool: str | None = None) -> AttemptJob:
    """An AttemptJob for ``trial`` of ``grid`` (``pool`` overrides the trial's own pool)."""
    if trial.backend not in backends.names():
        raise UserError(f"trial {trial.trial_id}: unknown backend {trial.backend!r}; "
                        f"known: {', '.join(sorted(backends.names()))}")
    spec = grid.spec
    return AttemptJob(
        grid_dir=str(grid_dir), trial=trial, config=grid.trial_config(trial, pool),
        checkpoint=spec.checkpoint,
        collapse=spec.collapse, early_stop=spec.early_stop_spec, tracking=tracking,
        submission=submission, backend_ref=backends.backend(trial.backend), start=start,
        reopen=reopen,
        tracking_every=spec.tracking.every, rescue=spec.rescue_policy)
