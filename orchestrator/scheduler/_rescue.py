"""The checks and writes behind a resume, shared by ``ablate resume`` (``_resume``) and a
submission's automatic ``on_collapse: {resume: ...}`` rescue (``auto_rescue``).

``select_trials`` picks the finished trials, ``plan`` checks everything a resume needs and writes
nothing (the trials, the target pool: catalogue, the backend's pool kind, the backend's own
plan-time check; the checkpoint, verified by SHA-256 and fetched from an fsspec store if remote;
for verl/k8s the world size, see ``verl.topology.portability``), ``apply`` writes the
requests (and seeds derived trials). Nothing here runs a trial: the caller does, under the
grid lease it holds.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.backends import Backend, backend
from orchestrator.exceptions import CheckpointError, GridError, UserError
from orchestrator.grid import (
    BUDGET_REFUSAL,
    derive_trial,
    entry_for,
    fixed_on_resume,
    lineage,
    notes,
)
from orchestrator.pools import PoolSpec
from orchestrator.scheduler._bookkeeping import park_unplaceable
from orchestrator.scheduler._placement import Placement
from orchestrator.store import MANIFEST, CheckpointStore, ResumeRequest, TrialPaths, records
from orchestrator.trial import Attempt, TrialSpec, TrialState, transition

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
    from orchestrator.scheduler._budget import Planner
    from orchestrator.schema import RescueEntry

log = logging.getLogger(__name__)
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


# --------------------------------------------------------------------------- automatic rescue


def auto_rescue(grid: GridSpec, grid_dir: Path, trial_ids: Iterable[str], *,
                budget: Planner | None = None) -> list[TrialSpec]:
    """The grid's rescue policy (``rescue:``; ``on_collapse:`` is its one-entry form) for the
    finished trials among ``trial_ids``: the trials to run now.

    Called by the scheduler under the grid lease after a submission's trials ran. Which entry
    acts, and how often, is ``grid.entry_for``'s; every rescue or refusal (no checkpoint, pool
    refused, over budget) is a note in the trial's ``state.json`` (``rescues``) instead of a
    failed submit. A rescue's derived trial that a killed submission seeded but never ran is
    returned again, so a re-submission runs it once and rescues nothing twice.
    """
    policy = grid.spec.rescue_policy
    out: dict[str, TrialSpec] = {}
    for tid in trial_ids:
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        parent = records.load_spec(paths)
        if parent is None or not policy:
            continue
        for child in _unfinished_rescues(grid_dir, rec):
            out.setdefault(child.trial_id, child)
        event, step = _event(rec)
        found = entry_for(policy, event, rec) if event is not None and _own(rec, event, step) else None
        if found is None:
            continue
        for trial in _rescue_one(grid, grid_dir, rec, parent, found, event, step, budget):
            out.setdefault(trial.trial_id, trial)
    return list(out.values())


class Rescuer:
    """A submission's rescue policy at work, under its lease: ``now`` for the running fit (its
    gate asks as each trial ends, so a collapse or a warning is acted on then, not once every
    trial of the grid has), ``rounds`` after the fit for what is left (a trial Tune gave up on
    is marked failed only after it). ``made``: every rescue of the submission, in order."""

    def __init__(self, grid: GridSpec, grid_dir: Path, planner: Planner | None,
                 placements: Mapping[str, Placement],
                 routes: Callable[[list[TrialSpec]], dict[str, str]]) -> None:
        self.grid, self.grid_dir, self.planner = grid, grid_dir, planner
        self.placements, self.routes = placements, routes
        self.made: list[TrialSpec] = []

    def _found(self, trial_ids: list[str]) -> list[TrialSpec]:
        if "*" in records.cancel_requests(self.grid_dir):  # `ablate cancel GRID`: no rescue either
            return []
        found = auto_rescue(self.grid, self.grid_dir, trial_ids, budget=self.planner)
        have = {t.trial_id for t in self.made}
        self.made += [t for t in found if t.trial_id not in have]
        return found

    def now(self, trial_id: str) -> list[tuple[TrialSpec, str]]:
        """The rescues of a trial that just ended, each with the pool it runs on; one whose
        pool has no capacity stays pending with the reason."""
        found = self._found([trial_id])
        routes = self.routes(found)
        return [(t, routes[t.trial_id])
                for t in park_unplaceable(self.grid_dir, found, self.placements, routes)]

    def rounds(self, trial_ids: list[str],
               fit: Callable[[list[TrialSpec], dict[str, str], int], Any]) -> list[TrialSpec]:
        """Rounds of rescues, each ``fit(runnable, routes, n)``, until no trial has an entry
        left to act on (each entry acts on a trial a bounded number of times, so this ends)."""
        ids = list(dict.fromkeys([*trial_ids, *(t.trial_id for t in self.made)]))
        for n in itertools.count(1):
            found = self._found(ids)
            if not found:
                return self.made
            ids = list(dict.fromkeys(ids + [t.trial_id for t in found]))
            again = self.routes(found)
            fit(park_unplaceable(self.grid_dir, found, self.placements, again), again, n)
        return self.made


def _event(rec: records.TrialRecord) -> tuple[str | None, int | None]:
    """The event a finished trial ended on that a rescue entry may act on, and its step."""
    verdict = rec.verdict or {}
    if not rec.state.is_finished() or rec.state is TrialState.CANCELLED:
        return None, None
    if verdict.get("rescued_step") is not None:
        return f"warning:{verdict.get('rescued_by')}", int(verdict["rescued_step"])
    if rec.state is TrialState.FAILED:  # Tune's retries are spent
        return "infra_failed", rec.last_step
    if verdict.get("kind") == "collapsed":
        return "collapsed", verdict.get("step")
    return None, None


def _own(rec: records.TrialRecord, event: str, step: int | None) -> bool:
    """Whether the event is still the trial's to be rescued on: not one a trial derived from it
    already took over (it is rescued once, whatever ``times`` allows), nor, for a derived trial,
    one at or before its first step (its parent's, inherited with the steps before it)."""
    taken = any(n.get("event") == event and n.get("step") == step and not n.get("refused")
                and n.get("trial") not in (None, rec.trial_id) for n in notes(rec))
    start = (rec.rescue_of or {}).get("step")
    inherited = (event != "infra_failed" and start is not None and step is not None
                 and step <= start)
    return not taken and not inherited


def _unfinished_rescues(grid_dir: Path, rec: records.TrialRecord) -> list[TrialSpec]:
    out = []
    for note in notes(rec):
        child = note.get("trial")
        if not child or child == rec.trial_id:
            continue
        paths = TrialPaths(grid_dir, child)
        spec = records.load_spec(paths)
        if spec is not None and not records.load_state(paths, child).state.is_finished():
            out.append(spec)
    return out


def _rescue_one(grid: GridSpec, grid_dir: Path, rec: records.TrialRecord, parent: TrialSpec,
                found: tuple[int, RescueEntry], event: str, step: int | None,
                budget: Planner | None) -> list[TrialSpec]:
    """One entry's rescue of one trial: planned, checked against the budget, applied; or a
    recorded refusal."""
    index, entry = found
    tid = parent.trial_id
    by = "on_collapse" if grid.spec.on_collapse is not None else f"rescue[{index}]"
    note: dict[str, Any] = {"event": event, "entry": index, "by": by, "step": step}
    action = entry.resume
    target = action.pool or rec.pool or parent.pool
    what = event if entry.warning is None else f"warning {entry.warning} at step {step}"
    reason = f"{by} rescue of {what} trial {tid}"
    paths = TrialPaths(grid_dir, tid)
    try:
        start: str | int = action.start
        if entry.warning is not None:  # the newest checkpoint at or before the warning
            have = [s for s in _store(grid, paths, tid).steps() if step is not None and s <= step]
            if not have:
                raise CheckpointError(f"trial {tid}: no checkpoint at or before step {step} of "
                                      f"warning {entry.warning}; fix: a smaller checkpoint.every")
            start = have[-1]
        plans = plan(grid, grid_dir, [parent], pool=target, start=start, sets=dict(action.set),
                     reason=reason, derive=entry.warning is not None)
    except UserError as exc:
        return _refuse(paths, rec, note, str(exc), "plan")
    why = budget.refuse_rescue(plans[0].trial, target, plans[0].start) if budget is not None else None
    if why is not None:
        return _refuse(paths, rec, note, why, BUDGET_REFUSAL)
    return apply(grid, grid_dir, plans, rescue=note)


def _refuse(paths: TrialPaths, rec: records.TrialRecord, note: dict[str, Any], why: str,
            kind: str) -> list[TrialSpec]:
    log.warning("trial %s: %s rescue refused: %s", rec.trial_id, note["by"], why)
    note = {**note, "error": why, "refused": kind, "at": time.time()}
    rec.rescues = [*notes(rec), note]
    rec.rescue = note
    records.save_state(paths, rec)
    return []


# --------------------------------------------------------------------------- checking


def plan(grid: GridSpec, grid_dir: Path, parents: Sequence[TrialSpec], *, pool: str,
         start: str | int, sets: Mapping[str, Any], reason: str, derive: bool = False) -> list[Plan]:
    """Check everything a resume needs and return what to do; writes nothing."""
    for key, value in sets.items():
        why = fixed_on_resume(key)
        if why is not None:
            raise UserError(f"--set {key}={json.dumps(value, default=str)}: {why}; fix: make it "
                            "an axis of the grid (its trials train from scratch)")
    pool_spec = grid.pools.get(pool, file=grid.file, key="--pool")
    runs = backend(grid.backend)
    kinds = runs.pool_kinds
    if pool_spec.kind not in kinds:
        same = [n for n in grid.pools.names() if grid.pools.get(n).kind in kinds]
        raise UserError(f"--pool {pool}: a {pool_spec.kind} pool, but grid {grid.name} runs the "
                        f"{grid.backend} backend on {kinds[0]} pools"
                        f"{''.join(f' (or {k} pools)' for k in kinds[1:])}; use one of: "
                        f"{', '.join(same)}")
    runs.require([pool_spec], where=f"--pool {pool}")
    out = []
    for parent in parents:
        paths = TrialPaths(grid_dir, parent.trial_id)
        rec = records.load_state(paths, parent.trial_id)
        store = _store(grid, paths, parent.trial_id)
        step = start_step(store, rec, start, grid.spec.checkpoint.healthy_margin)
        ckpt = store.path(step)  # verified by SHA-256 (downloaded first from a remote store)
        derived = bool(sets) or derive
        trial = _derive(grid, parent, sets, pool, step) if derived else parent
        if derived and step >= parent.steps:  # after the values are checked: they come first
            raise UserError(_no_step_left(parent, step, store.steps(), start))
        _check_pool(grid, runs, trial, pool_spec, ckpt)
        if trial is not parent:
            child = records.load_state(TrialPaths(grid_dir, trial.trial_id), trial.trial_id)
            if child.state.is_finished():
                raise UserError(f"trial {trial.trial_id} was already derived from {parent.trial_id} "
                                f"at step {step} with these settings ({child.state.value}); "
                                f"resume it with --trial {trial.trial_id}")
        out.append(Plan(trial, parent, pool, step, reason))
    return out


def _derive(grid: GridSpec, parent: TrialSpec, sets: Mapping[str, Any], pool: str,
            step: int) -> TrialSpec:
    """The derived trial; a value it cannot run with is the ``--set``'s (or ``--pool``'s)
    mistake, said so, not the grid's axes with an ``exclude:`` to add."""
    try:
        return derive_trial(grid, parent, sets, pool=pool, from_step=step)
    except GridError as exc:
        if exc.key and exc.key.startswith("--set"):
            raise  # already about the --set value (allowed values, did-you-mean)
        given = " ".join(f"--set {k}={json.dumps(v, default=str)}" for k, v in sets.items())
        flag = given or f"--pool {pool}"
        raise UserError(f"{flag}: trial {parent.trial_id} cannot run with it: {exc.problem}; "
                        f"fix: change the {'--set value' if given else '--pool'}") from None


def _no_step_left(parent: TrialSpec, step: int, have: Sequence[int], start: str | int) -> str:
    """A derived trial from the parent's last step would run no step under its new setting
    (its numbers would be the parent's): the message names the checkpoints to start from."""
    earlier = [s for s in have if s < parent.steps]
    how = (f"--from {start}" if not isinstance(start, str) or start.isdigit()
           else f"--from {start} is step {step}")
    fix = (f"--from STEP with an earlier checkpoint: {', '.join(map(str, earlier))}" if earlier
           else "no earlier checkpoint exists; rerun the grid with the setting as an axis value")
    return (f"trial {parent.trial_id}: {how}, its last step (steps: {parent.steps}): a derived "
            f"trial would run no step under its new setting and repeat the parent's numbers; "
            f"fix: {fix}")


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


def _check_pool(grid: GridSpec, runs: Backend, trial: TrialSpec, pool: PoolSpec,
                ckpt: Path) -> None:
    """The trainer's plan-time check on the target pool, and whether the checkpoint resumes
    there (verl: its world size)."""
    config = grid.trial_config(trial, pool.name)
    problem = runs.problem(config, frozenset({"combination"}))
    if problem:
        raise UserError(f"trial {trial.trial_id} cannot run on pool {pool.name}: {problem}")
    problem = runs.problem(config, frozenset({"checkpoint"}), checkpoint=ckpt,
                           others=tuple(grid.pools.pools.values()))
    if problem:
        raise CheckpointError(f"trial {trial.trial_id}: {problem}")


def _store(grid: GridSpec, paths: TrialPaths, trial_id: str) -> CheckpointStore:
    ck = grid.spec.checkpoint
    return CheckpointStore.for_trial(ck.store, paths.root, trial_id, ck.keep)


# --------------------------------------------------------------------------- applying


def apply(grid: GridSpec, grid_dir: Path, plans: Sequence[Plan], *,
          rescue: Mapping[str, Any] | None = None) -> list[TrialSpec]:
    """Write the resume requests (and seed derived trials); returns the trials to run.
    ``rescue``: the note of the rescue policy's entry that asked for it (event, entry, by)."""
    out = []
    for p in plans:
        note = {"by": "ablate resume", **(rescue or {}), "trial": p.trial.trial_id,
                "pool": p.pool, "start": p.start, "at": time.time()}
        paths = TrialPaths(grid_dir, p.parent.trial_id)
        rec = records.load_state(paths, p.parent.trial_id)
        if p.derived:  # a rescue's trial carries its lineage's rescues: `times` bounds them all
            _seed_derived(grid, grid_dir, p, rescue_of=(
                {"parent": p.parent.trial_id, "event": rescue.get("event"), "step": p.start,
                 "lineage": lineage(dataclasses.replace(rec, rescues=[*notes(rec), note]))}
                if rescue else None))
        if rescue:  # in the same write as the request: a killed submit rescues nothing twice
            rec.rescues = [*notes(rec), note]
            rec.rescue = note
        if not p.derived:
            rec.resume = ResumeRequest(p.pool, p.start, p.reason)
            rec.state = transition(rec.state, TrialState.PENDING, resume=True)
            rec.verdict = rec.error = None
        if rescue or not p.derived:  # a manual derivation leaves the parent's files alone
            records.save_state(paths, rec)
        records.clear_cancel_requests(grid_dir, [p.trial.trial_id])
        out.append(p.trial)
    return out


def _seed_derived(grid: GridSpec, grid_dir: Path, p: Plan,
                  rescue_of: dict[str, Any] | None = None) -> None:
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
                              resume=ResumeRequest(p.pool, p.start, p.reason), rescue_of=rescue_of)
    records.save_state(paths, rec)
