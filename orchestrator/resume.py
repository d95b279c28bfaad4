"""``ablate resume``: continue failed or collapsed trials from a checkpoint, possibly on another
pool, with lineage kept; and the grid's automatic ``on_collapse: {resume: ...}`` rescue.

Two kinds of resume:

* without ``--set`` the same trial goes on: its ``state.json`` gets a request ``{pool, start}``
  that the next attempt consumes (``attempt.AttemptRun``), and a new attempt record holds its pool
  and step range. ``--pool`` is the only way a trial ever leaves its pool.
* with ``--set`` (or ``--derive``) a new trial is derived (``grid.derive_trial``): its own
  ``derived_from = (parent id, step)`` link, the parent's checkpoint at that step copied into its
  own store, the parent's metrics up to that step as its history (attempts marked ``inherited``),
  and its own MLflow child run tagged ``derived_from``.

Everything is checked before anything is written (one-line ``UserError``/``CheckpointError``;
the trial's files and MLflow stay as they were): the trials, the target pool (catalogue, the
backend's pool kind, the backend's own plan-time check), the checkpoint (verified by SHA-256,
fetched from an fsspec store if remote), and for verl/k8s the world size (verl shards are keyed
by it, see ``backends.verl.portability``). The grid lease is then held while the requests are
written and the attempts run (through the Ray Tune scheduler, or in this process with
``local=True``), so a resume never races an ``ablate submit`` of the same grid.

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

import dataclasses
import logging
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import records, workspace
from orchestrator.checkpoints import MANIFEST, CheckpointStore
from orchestrator.exceptions import CheckpointError, UserError, did_you_mean
from orchestrator.trial import Attempt, TrialPaths, TrialSpec, TrialState, transition

log = logging.getLogger(__name__)
COLLAPSED = ("collapsed", "numeric_failure")  # a NaN blow-up is a collapse for `--collapsed`
_JUDGED = ("collapsed", "unstable", "numeric_failure")  # verdicts with a damage onset step


@dataclasses.dataclass(frozen=True)
class Plan:
    """One checked resume: ``trial`` runs next on ``pool`` from checkpoint ``start``."""

    trial: TrialSpec  # the parent itself, or the derived trial
    parent: TrialSpec
    pool: str
    start: int
    reason: str

    @property
    def derived(self) -> bool:
        return self.trial.trial_id != self.parent.trial_id


# --------------------------------------------------------------------------- entry points


def resume(grid_path: str, *, select: str | None = None, trial_ids: Sequence[str] = (),
           pool: str, start: str | int = "last-healthy", sets: Mapping[str, Any] | None = None,
           workdir: str | None = None, tracking_uri: str | None = None, address: str | None = None,
           local: bool = False, progress: bool = True, derive: bool = False) -> dict[str, Any]:
    """Resume the selected trials (``select`` "failed"/"collapsed", or ``trial_ids``) on ``pool``.

    ``derive`` (implied by ``sets``) runs each continuation as a new derived trial and leaves the
    parent as it ended, so both stay comparable (e.g. a collapsed run and its rescue on another pool).

    Returns ``{"grid", "resumed": [...], "results": {trial id: result}}``. Raises a one-line
    ``UserError`` before anything changes when the input, the pool or a checkpoint is bad, and
    ``ConcurrencyError`` when the grid is running.
    """
    from orchestrator.grid import load_grid
    from orchestrator.lease import GridLease

    grid = load_grid(grid_path)
    grid_dir = workspace.grid_dir(grid.name, workdir)
    if not (grid_dir / "trials").is_dir():
        raise UserError(f"grid {grid.name} has no runs in {workspace.workdir(workdir)}; "
                        f"nothing to resume (start it with `ablate submit {grid_path}`)")
    submission = time.strftime("%Y%m%d-%H%M%S") + "-resume-" + uuid.uuid4().hex[:6]
    lease = GridLease(grid_dir, grid.name)
    lease.acquire(submission)  # ConcurrencyError naming the holder while the grid runs
    try:
        parents = select_trials(grid_dir, select=select, trial_ids=trial_ids)
        plans = plan(grid, grid_dir, parents, pool=pool, start=start, sets=dict(sets or {}),
                     reason="ablate resume", derive=derive)
        trials = apply(grid, grid_dir, plans)
        summary: dict[str, Any] = {}
        if local:
            _run_local(grid, trials, grid_dir, submission, tracking_uri, workdir)
        else:
            from orchestrator.scheduler import run_trials

            summary = run_trials(grid, trials, submission=submission, address=address,
                                 tracking_uri=tracking_uri, workdir=workdir, progress=progress)
    finally:
        lease.release()
    results = {}
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        results[t.trial_id] = records.stored_result(paths, records.load_state(paths, t.trial_id))
    return {"grid": grid.name, "submission": submission, "results": results, "summary": summary,
            "resumed": [{"trial_id": p.trial.trial_id, "parent": p.parent.trial_id, "pool": p.pool,
                         "from_step": p.start, "derived": p.derived} for p in plans]}


def auto_rescue(grid: Any, grid_dir: Path, trial_ids: Iterable[str]) -> list[TrialSpec]:
    """The grid's ``on_collapse: {resume: ...}`` for collapsed trials not rescued before.

    Called by the scheduler under the grid lease after a submission's trials ran. Each trial is
    rescued at most once (``state.json`` ``rescue``); a rescue that cannot be planned (no healthy
    checkpoint, pool refused) is recorded there with its reason instead of failing the submit.
    Returns the trials to run now.
    """
    spec = grid.spec.on_collapse
    if spec is None:
        return []
    action = spec.resume
    out: list[TrialSpec] = []
    for tid in trial_ids:
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        parent = records.load_spec(paths)
        kind = (rec.verdict or {}).get("kind")
        if parent is None or rec.rescue is not None or not rec.state.is_finished() or kind != "collapsed":
            continue
        target = action.pool or rec.pool or parent.pool
        reason = f"on_collapse rescue of {kind} trial {tid}"
        try:
            plans = plan(grid, grid_dir, [parent], pool=target, start=action.start,
                         sets=dict(action.set), reason=reason)
        except UserError as exc:
            log.warning("trial %s: on_collapse rescue refused: %s", tid, exc)
            rec.rescue = {"by": "on_collapse", "error": str(exc), "at": time.time()}
            records.save_state(paths, rec)
            continue
        out.extend(apply(grid, grid_dir, plans, rescue=True))
    return out


# --------------------------------------------------------------------------- selection


def known_trials(grid_dir: Path) -> dict[str, TrialSpec]:
    """Every trial of the grid that has run (derived trials included), by id."""
    out = {}
    for spec_path in sorted((Path(grid_dir) / "trials").glob("*/spec.json")):
        spec = records.load_spec(TrialPaths(grid_dir, spec_path.parent.name))
        if spec is not None:
            out[spec.trial_id] = spec
    return out


def select_trials(grid_dir: Path, *, select: str | None, trial_ids: Sequence[str]) -> list[TrialSpec]:
    """The trials ``--failed``/``--collapsed``/``--trial`` names; only finished ones qualify."""
    known = known_trials(grid_dir)
    grid = Path(grid_dir).name
    if select not in (None, "failed", "collapsed"):
        raise UserError(f"select={select!r}: use 'failed', 'collapsed' or trial ids")
    if select is None and not trial_ids:
        raise UserError("name the trials to resume: --failed, --collapsed or --trial ID")
    for tid in trial_ids:
        if tid not in known:
            hint = did_you_mean(tid, known)
            raise UserError(f"grid {grid}: no trial {tid!r}"
                            + (f"; did you mean {hint!r}?" if hint else "; see `ablate status`"))
    chosen = []
    for tid, spec in known.items():
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        kind = (rec.verdict or {}).get("kind")
        if trial_ids:
            if tid not in trial_ids:
                continue
            if not rec.state.is_finished():
                raise UserError(f"grid {grid}: trial {tid} is {rec.state.value}, not finished; "
                                "`ablate resume` continues finished trials (`ablate submit` "
                                "continues unfinished ones)")
        elif not _matches(select, rec.state, kind):
            continue
        chosen.append(spec)
    if not chosen:
        raise UserError(f"grid {grid}: no {select} trials to resume; see `ablate status {grid}`")
    return chosen


def _matches(select: str | None, state: TrialState, kind: str | None) -> bool:
    if select == "failed":
        return state is TrialState.FAILED or kind == "infra_failure"
    return state.is_finished() and kind in COLLAPSED


# --------------------------------------------------------------------------- checking


def plan(grid: Any, grid_dir: Path, parents: Sequence[TrialSpec], *, pool: str,
         start: str | int, sets: Mapping[str, Any], reason: str, derive: bool = False) -> list[Plan]:
    """Check everything a resume needs and return what to do; writes nothing."""
    from orchestrator.grid import derive_trial

    pool_spec = grid.pools.get(pool, file=grid.file, key="--pool")
    backend = _backend_class(grid.backend)
    kinds = getattr(backend, "pool_kinds", (backend.pool_kind,))
    if pool_spec.kind not in kinds:
        same = [n for n in grid.pools.names() if grid.pools.get(n).kind in kinds]
        raise UserError(f"--pool {pool}: a {pool_spec.kind} pool, but grid {grid.name} runs the "
                        f"{grid.backend} backend on {kinds[0]} pools"
                        f"{''.join(f' (or {k} pools)' for k in kinds[1:])}; use one of: "
                        f"{', '.join(same)}")
    out = []
    for parent in parents:
        paths = TrialPaths(grid_dir, parent.trial_id)
        rec = records.load_state(paths, parent.trial_id)
        store = _store(grid, paths, parent.trial_id)
        step = start_step(store, rec, start, grid.spec.checkpoint.healthy_margin)
        ckpt = store.path(step)  # verified by SHA-256 (downloaded first from a remote store)
        derived = bool(sets) or derive
        trial = derive_trial(grid, parent, sets, pool=pool, from_step=step) if derived else parent
        _check_pool(grid, backend, trial, pool_spec, ckpt)
        if trial is not parent:
            child = records.load_state(TrialPaths(grid_dir, trial.trial_id), trial.trial_id)
            if child.state.is_finished():
                raise UserError(f"trial {trial.trial_id} was already derived from {parent.trial_id} "
                                f"at step {step} with these settings ({child.state.value}); "
                                f"resume it with --trial {trial.trial_id}")
        out.append(Plan(trial, parent, pool, step, reason))
    return out


def start_step(store: CheckpointStore, rec: records.TrialRecord, start: str | int, margin: int) -> int:
    """The checkpoint step to resume from (``last-healthy``, ``latest`` or an explicit step)."""
    have = store.steps()
    tid = store.trial_id
    if isinstance(start, int) or (isinstance(start, str) and start.isdigit()):
        return int(start)  # verified by the caller (store.path names the steps there are)
    if start not in ("last-healthy", "latest"):
        raise UserError(f"--from {start!r}: use last-healthy, latest or a step number")
    verdict = rec.verdict or {}
    bound = None
    if start == "last-healthy" and verdict.get("kind") in _JUDGED and verdict.get("step") is not None:
        bound = int(verdict["step"]) - margin
    candidates = [s for s in have if bound is None or s < bound]
    if not candidates:
        why = (f"before step {bound} (verdict {verdict.get('kind')} at step {verdict.get('step')}, "
               f"checkpoint.healthy_margin {margin})" if bound is not None else "at all")
        raise CheckpointError(f"trial {tid}: no checkpoint {why} in {store.url}; checkpoints: "
                              f"{have or 'none'}; fix: --from STEP with one of them, or rerun the "
                              f"trial from scratch (`ablate run-trial GRID --trial {tid} --fresh`)")
    return candidates[-1]


def _check_pool(grid: Any, backend: Any, trial: TrialSpec, pool: Any, ckpt: Path) -> None:
    """The backend's plan-time check on the target pool, and verl's world-size portability."""
    from orchestrator.corrections import CorrectionSpec
    from orchestrator.engine import RolloutSpec

    config = grid.trial_config(trial)
    corr = CorrectionSpec.model_validate(dict(config.get("correction") or {})).canonical()
    roll = RolloutSpec.model_validate(dict(config.get("rollout") or {}))
    problem = backend.check(corr, roll, pool)
    if problem:
        raise UserError(f"trial {trial.trial_id} cannot run on pool {pool.name}: {problem}")
    if backend.pool_kind != "gpu":
        return  # simulator checkpoints hold the whole state: portable to any sim pool
    from orchestrator.backends.verl import checkpoint_world_size, portability

    saved = checkpoint_world_size(ckpt)
    if saved is None:
        raise CheckpointError(f"trial {trial.trial_id}: checkpoint {ckpt} has no verl "
                              "model_world_size_* shards; cannot check it fits pool "
                              f"{pool.name}; pick another step with --from")
    ok, why = portability(saved, pool, config)
    if not ok:
        raise CheckpointError(f"trial {trial.trial_id}: not portable to pool {pool.name}: {why}")


def _backend_class(name: str) -> Any:
    from orchestrator.backends import backend_class

    cls = backend_class(name)
    if cls is None:
        raise UserError(f"backend {name!r} is not available in this version")
    return cls


def _store(grid: Any, paths: TrialPaths, trial_id: str) -> CheckpointStore:
    ck = grid.spec.checkpoint
    return CheckpointStore.for_trial(ck.store, paths.root, trial_id, ck.keep)


# --------------------------------------------------------------------------- applying


def apply(grid: Any, grid_dir: Path, plans: Sequence[Plan], *, rescue: bool = False) -> list[TrialSpec]:
    """Write the resume requests (and seed derived trials); returns the trials to run."""
    out = []
    for p in plans:
        note = {"by": "on_collapse" if rescue else "ablate resume", "trial": p.trial.trial_id,
                "pool": p.pool, "start": p.start, "at": time.time()}
        if p.derived:
            _seed_derived(grid, grid_dir, p)
        paths = TrialPaths(grid_dir, p.parent.trial_id)
        rec = records.load_state(paths, p.parent.trial_id)
        if rescue:
            rec.rescue = note  # in the same write as the request: a trial is rescued once
        if not p.derived:
            rec.resume = {"pool": p.pool, "start": p.start, "reason": p.reason}
            rec.state = transition(rec.state, TrialState.PENDING, resume=True)
            rec.verdict = rec.error = None
        if rescue or not p.derived:  # a manual derivation leaves the parent's files alone
            records.save_state(paths, rec)
        records.clear_cancel_requests(grid_dir, [p.trial.trial_id])
        out.append(p.trial)
    return out


def _seed_derived(grid: Any, grid_dir: Path, p: Plan) -> None:
    """A derived trial starts as a copy of its parent at ``p.start``: checkpoint, metric
    history and (inherited) attempt ranges; its state is written last, so a crash in between
    leaves a trial that the same resume command seeds again."""
    parent_paths, paths = TrialPaths(grid_dir, p.parent.trial_id), TrialPaths(grid_dir, p.trial.trial_id)
    paths.root.mkdir(parents=True, exist_ok=True)
    records.save_spec(paths, p.trial)
    src = _store(grid, parent_paths, p.parent.trial_id)
    src.protect(src.protected() | {p.start})  # the link must stay resolvable
    ckpt = src.path(p.start)
    _store(grid, paths, p.trial.trial_id).save(
        p.start, lambda d: shutil.copytree(ckpt, d, dirs_exist_ok=True,
                                           ignore=shutil.ignore_patterns(MANIFEST)))
    history = [(s, m) for s, m in records.iter_metrics(parent_paths.metrics) if s <= p.start]
    records.write_metrics(paths.metrics, history)
    inherited = []
    for pool, lo, hi in records.effective_ranges(records.load_attempts(parent_paths)):
        hi = p.start if hi is None else min(hi, p.start)
        if lo <= hi:
            inherited.append(Attempt(number=len(inherited) + 1, pool=pool, start_step=lo, end_step=hi,
                                     outcome="inherited",
                                     reason=f"steps {lo}-{hi} of trial {p.parent.trial_id}"))
    records.save_attempts(paths, inherited)
    rec = records.TrialRecord(trial_id=p.trial.trial_id, pool=p.pool, last_step=p.start,
                              resume={"pool": p.pool, "start": p.start, "reason": p.reason})
    records.save_state(paths, rec)


def _run_local(grid: Any, trials: Sequence[TrialSpec], grid_dir: Path, submission: str,
               tracking_uri: str | None, workdir: str | None) -> None:
    """Run the resumed attempts one after another in this process (no Ray, like run-trial)."""
    from orchestrator.runner import TrackingTarget, make_job, run_attempt
    from orchestrator.tracking import GridRun

    uri = workspace.tracking_uri(tracking_uri, workdir)
    parent = GridRun.open(grid, tracking_uri=uri, workdir=workspace.workdir(workdir))
    target = TrackingTarget(uri, parent.experiment_id, parent.run_id)
    status = "FAILED"
    try:
        for t in trials:
            rec = records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id)
            run_attempt(make_job(grid, t, grid_dir=grid_dir, tracking=target, submission=submission,
                                 pool=records.route_pool(rec, t)))
        status = "FINISHED"
    finally:
        parent.end(status)


__all__ = ["Plan", "apply", "auto_rescue", "known_trials", "plan", "resume",
           "select_trials", "start_step"]
