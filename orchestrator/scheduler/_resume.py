"""``ablate resume``: continue failed or collapsed trials from a checkpoint, possibly on another
pool, with lineage kept; and the grid's automatic ``on_collapse: {resume: ...}`` rescue.

Two kinds of resume:

* without ``--set`` the same trial goes on: its ``state.json`` gets a ``ResumeRequest`` (pool,
  start, reason) that the next attempt consumes (``run._start.AttemptStart``), and a new attempt
  record holds its pool and step range. ``--pool`` is the only way a trial ever leaves its pool.
* with ``--set`` (or ``--derive``) a new trial is derived (``grid.derive_trial``): its own
  ``derived_from = (parent id, step)`` link, the parent's checkpoint at that step copied into its
  own store, the parent's metrics up to that step as its history (attempts marked ``inherited``),
  and its own MLflow child run tagged ``derived_from``.

Everything is checked before anything is written (one-line ``UserError``/``CheckpointError``;
the trial's files and MLflow stay as they were): the trials, the target pool (catalogue, the
backend's pool kind, the backend's own plan-time check), the checkpoint (verified by SHA-256,
fetched from an fsspec store if remote), and for verl/k8s the world size (verl shards are keyed
by it, see ``verl.topology.portability``), and what the run needs outside this
process: the workdir, the tracking store (a server must answer) and the Ray cluster
(``--address`` must answer). The grid lease is then held while the requests are written and the
attempts run (through the Ray Tune scheduler, or in this process with ``local=True``), so a
resume never races an ``ablate submit`` of the same grid. Should the run still fail before a
trial's attempt starts (or its pool have no capacity), that trial's finished record is put
back as it was, verdict included: a refused resume loses nothing.

MLflow, one step axis: MLflow has no API to delete metric points, so when a resume starts
before the last step the trial's child run holds, re-logging steps would leave two values per
step. Instead the runner replaces the child run by a fresh one (same run name, ``trial_id`` tag,
params and parent), refilled from ``metrics.jsonl`` up to the resume step (the local file is the
truth), tagged ``supersedes`` and with every attempt's pool and step range (``attempt.N.*``,
``pool_steps``, ``attempts.json``); the replaced rows (the collapse) go to a
``superseded-<run>.json`` artifact and ``superseded/attempt-N.jsonl`` in the trial directory;
the old run is tagged ``superseded_by`` and soft-deleted (restorable in the UI). ``state.json``
records the new run id and the ``superseded_runs``. Readers therefore see exactly one run per
trial whose steps 1..N have one value each. A resume from the last step MLflow holds keeps the
literal same run.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import UserError
from orchestrator.grid import load_grid
from orchestrator.run import make_job, run_attempt
from orchestrator.scheduler._events import Sink
from orchestrator.scheduler._identity import as_submitted, check_scheme, renamed
from orchestrator.scheduler._lineage import select_trials
from orchestrator.scheduler._placement import check_address
from orchestrator.scheduler._repair import missing_before, repair_metrics
from orchestrator.scheduler._reports import ResumeReport
from orchestrator.scheduler._rescue import Plan, apply, plan
from orchestrator.scheduler._submission import run_trials, submission_id
from orchestrator.store import GridLease, TrialPaths, atomic_write_json, records, workspace
from orchestrator.tracking import check_store, parent_run
from orchestrator.trial import TrialSpec, TrialState

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec


def resume(grid_path: str, *, select: str | None = None, trial_ids: Sequence[str] = (),
           pool: str, start: str | int = "last-healthy", sets: Mapping[str, Any] | None = None,
           workdir: str | None = None, tracking_uri: str | None = None, address: str | None = None,
           local: bool = False, progress: bool = True, derive: bool = False,
           name: str | None = None, events: Sink | None = None) -> ResumeReport:
    """Resume the selected trials (``select`` "failed"/"collapsed", or ``trial_ids``) on ``pool``.

    ``derive`` (implied by ``sets``) runs each continuation as a new derived trial and leaves the
    parent as it ended, so both stay comparable (e.g. a collapsed run and its rescue on another pool).
    ``events`` receives each trial event, as in ``submit``.

    Returns a ``ResumeReport`` (its document: ``{"grid", "resumed": [...], "results": {trial id:
    result}, "not_resumed": {trial id: why}}``). Raises a one-line ``UserError`` before anything changes when the input, the
    pool, a checkpoint, the tracking store or the Ray cluster is bad, and ``ConcurrencyError``
    when the grid is running. A trial whose attempt never starts (the run fails first, its pool
    has no capacity) keeps its finished record (``not_resumed``).
    """
    grid = renamed(load_grid(grid_path), name)  # `--name`: the grid as submitted under it
    grid_dir = workspace.grid_dir(grid.name, workdir)
    grid = as_submitted(grid, grid_dir)  # `ablate submit --backend`: the backend it ran on
    if not (grid_dir / "trials").is_dir():
        raise UserError(f"grid {grid.name} has no runs in {workspace.workdir(workdir)}; "
                        f"nothing to resume (start it with `ablate submit {grid_path}`)")
    # Check everything, then write: what the run needs outside this process first (the store,
    # the cluster), so a refused resume leaves every finished trial as it was.
    uri = workspace.tracking_uri(tracking_uri, workdir)
    workspace.check_workdir(workdir)
    check_store(uri)
    if not local:
        check_address(address)
    check_scheme(grid, grid_dir)  # ids of an older scheme: refused before anything is written
    submission = submission_id("resume")
    lease = GridLease(grid_dir, grid.name)
    lease.acquire(submission)  # ConcurrencyError naming the holder while the grid runs
    try:
        parents = select_trials(grid_dir, select=select, trial_ids=trial_ids)
        plans = plan(grid, grid_dir, parents, pool=pool, start=start, sets=dict(sets or {}),
                     reason="ablate resume", derive=derive)
        _check_histories(grid, grid_dir, plans, uri)
        before = _snapshot(grid_dir, plans)
        trials = apply(grid, grid_dir, plans)  # the first write to a trial's records
        summary: dict[str, Any] = {}
        try:
            if local:
                _run_local(grid, trials, grid_dir, submission, tracking_uri, workdir)
            else:
                summary = run_trials(grid, trials, submission=submission, address=address,
                                     tracking_uri=tracking_uri, workdir=workdir,
                                     progress=progress, events=events)
        except BaseException:
            _restore_unstarted(grid_dir, before)  # what never started keeps its old verdict
            raise
        not_resumed = _restore_unstarted(grid_dir, before)
    finally:
        lease.release()
    results = {}
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        results[t.trial_id] = records.stored_result(paths, records.load_state(paths, t.trial_id))
    return ResumeReport({
        "grid": grid.name, "submission": submission, "results": results, "summary": summary,
        "not_resumed": not_resumed,
        "resumed": [{"trial_id": p.trial.trial_id, "parent": p.parent.trial_id, "pool": p.pool,
                     "from_step": p.start, "derived": p.derived} for p in plans
                    if p.trial.trial_id not in not_resumed]})


def _snapshot(grid_dir: Path, plans: Sequence[Plan]) -> dict[str, tuple[records.TrialRecord, int]]:
    """The finished records a resume is about to reset (the trial goes on in place), with
    their number of attempts."""
    out = {}
    for p in plans:
        if not p.derived:
            paths = TrialPaths(grid_dir, p.parent.trial_id)
            out[p.parent.trial_id] = (records.load_state(paths, p.parent.trial_id),
                                      len(records.load_attempts(paths)))
    return out


def _restore_unstarted(grid_dir: Path, before: Mapping[str, tuple[records.TrialRecord, int]]
                       ) -> dict[str, str]:
    """Trials whose resume never started an attempt (the run failed first, or their pool has no
    capacity) get their finished record back, verdict included: {trial id: why not resumed}."""
    out = {}
    for tid, (old, attempts) in before.items():
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        if rec.state is not TrialState.PENDING or len(records.load_attempts(paths)) != attempts:
            continue  # an attempt started: the resume happened
        out[tid] = rec.pending_reason or rec.error or "its attempt never started"
        atomic_write_json(paths.state, old.to_json())  # as it was, its time stamp included
    return out


def _check_histories(grid: GridSpec, grid_dir: Path, plans: Sequence[Plan], uri: str) -> None:
    """A resume keeps the parent's metrics up to its start step: a damaged file is repaired from
    MLflow first, and a resume that would keep a hole is refused (``_repair``)."""
    for p in plans:
        paths = TrialPaths(grid_dir, p.parent.trial_id)
        rec = records.load_state(paths, p.parent.trial_id)
        note = repair_metrics(paths, rec, tracking_uri=uri, checkpoint=grid.spec.checkpoint,
                              reopen=False)
        if note is not None:
            print(f"repaired: {note}", file=sys.stderr, flush=True)
        problem = missing_before(paths, rec, p.start)
        if problem is not None:
            have = records.check_metrics(paths.metrics, rec.last_step).good_through
            raise UserError(f"trial {p.parent.trial_id}: cannot resume from step {p.start}: "
                            f"{problem}; fix: `--from` a checkpoint at or before step {have}, or "
                            f"`ablate submit` the grid first (it recomputes the missing steps)")


def _run_local(grid: GridSpec, trials: Sequence[TrialSpec], grid_dir: Path, submission: str,
               tracking_uri: str | None, workdir: str | None) -> None:
    """Run the resumed attempts one after another in this process (no Ray, like run-trial)."""
    uri = workspace.tracking_uri(tracking_uri, workdir)
    with parent_run(grid, tracking_uri=uri, workdir=workspace.workdir(workdir)) as target:
        for t in trials:
            rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
            run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=target, submission=submission,
                                 pool=records.route_pool(rec, t)))
