"""``ablate evaluate GRID [--trial ...]``: a grid's saved checkpoints scored after the fact by
the reference evaluator (``orchestrator/evaluation.py``), also for grids recorded before it
existed or that did not set ``eval: {reference: ...}``.

For each chosen trial, each checkpoint its store still holds is scored unless the step already
has a reference score (logged by the trial itself, or by an earlier ``ablate evaluate``): a
second run scores nothing. The scores go to the trial's ``reference.json``
(``store.reference``, written after each step) and to its MLflow run as ``eval/reward_ref`` at
that step; a score MLflow did not take is sent by the next run. The grid's lease is held
throughout (nothing else writes its trials meanwhile), and a trial whose run lock is taken (a
runner or a sender is on it) is left for a later run.

A reference that is a job of its own (``engine``: ``evaluation.reference_job``) runs here, one
job per checkpoint on the grid's evaluation pool, from the grid's shared config; a job that
fails leaves its trial unscored with the reason (the next run tries again), and the job's logs
and evidence (``evidence.json``: its validation metrics, the engine that ran) stay under the
trial's ``logs/reference-step-<N>/``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

from orchestrator import evaluation, recipes
from orchestrator import metrics as M
from orchestrator.backends import Backend, Evaluator, TrialConfig, backend
from orchestrator.cost import pool_rate
from orchestrator.exceptions import CheckpointError, InfraFailure, UserError, no_such_trial
from orchestrator.grid import GridSpec, load_grid
from orchestrator.pools import PoolSpec
from orchestrator.scheduler._identity import as_submitted
from orchestrator.store import (
    CheckpointStore,
    GridLease,
    TrialPaths,
    atomic_write_json,
    records,
    workspace,
)
from orchestrator.store.reference import (
    ReferenceScores,
    read_reference,
    send_reference,
    write_reference,
)
from orchestrator.tracking import client, log_steps
from orchestrator.trial import TrialSpec

log = logging.getLogger(__name__)
EVALUATOR_TAG = "eval.reference_evaluator"  # the MLflow tag naming the scores' evaluator


@dataclasses.dataclass(frozen=True)
class _Job:
    """A reference that is a job of its own: its evaluation pool, engine settings, and the
    grid's shared config it runs (made once per ``ablate evaluate``)."""

    pool: PoolSpec
    rollout: dict[str, Any]
    shared: dict[str, Any]


@dataclasses.dataclass
class EvaluateReport:
    """What one ``ablate evaluate`` did: per trial the steps it scored, and why any was left."""

    target: str
    scored: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # an evaluation job's
    damaged: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # checkpoints
    unsent: int = 0

    def lines(self) -> list[str]:
        n = sum(len(v) for v in self.scored.values())
        out = [f"{tid}: scored steps {', '.join(map(str, steps))}"
               for tid, steps in self.scored.items() if steps]
        out += [f"{tid}: not scored ({why})" for tid, why in self.skipped.items()]
        out += [f"{tid}: evaluation job failed, not scored ({why}); the next run tries again"
                for tid, why in self.failed.items()]
        out += [f"{tid}: checkpoint {why}: it cannot be scored" for tid, whys in
                self.damaged.items() for why in whys]
        bad = sum(len(v) for v in self.damaged.values())
        out.append(f"reference {self.target}: {n} checkpoint(s) scored in {self.seconds:.1f}s"
                   + (f"; {bad} damaged checkpoint(s) not scored" if bad else "") if n or bad
                   else f"reference {self.target}: nothing to score (every saved checkpoint "
                   "has its score)")
        if self.unsent:
            out.append(f"{self.unsent} score(s) not in MLflow yet; the next `ablate evaluate` "
                       "sends them")
        return out


def evaluate(grid_path: str, *, trials: list[str] | None = None, workdir: str | None = None,
             tracking_uri: str | None = None, steps: list[int] | None = None) -> EvaluateReport:
    """Score the saved checkpoints of ``grid_path``'s recorded trials (all, or ``trials``; every
    step the store holds, or ``steps``)."""
    grid = load_grid(grid_path)
    grid = as_submitted(grid, workspace.grid_dir(grid.name, workdir))  # submit --backend's
    target = grid.spec.eval.reference or evaluation.REFERENCE_TARGETS[0]
    shared = grid.base_config
    found = evaluation.reference_job(shared)
    job = _Job(grid.pools.get(found[0]), found[1], shared) if found else None
    grid_dir = workspace.grid_dir(grid.name, workdir)
    known = records.known_trials(grid_dir) if (grid_dir / "trials").is_dir() else {}
    if not known:
        raise UserError(f"{grid.file}: grid {grid.name} has no recorded trials in "
                        f"{workspace.workdir(workdir)}; fix: `ablate submit {grid.file}` first")
    for tid in trials or []:
        if tid not in known:
            raise no_such_trial(tid, known, where=f"grid {grid.name}", see="see `ablate status`")
    chosen = [known[t] for t in (trials or sorted(known))]
    for spec in chosen:  # every refusal before anything is written
        pool = grid.pools.get(spec.pool)
        problem = backend(spec.backend).evaluator(pool).problem(target, pool)
        if problem:
            raise UserError(f"{grid.file}: trial {spec.trial_id} on pool {spec.pool}: {problem}")
    if job is not None:
        _check_job(grid, chosen, job)
    uri = workspace.tracking_uri(tracking_uri, workdir)
    report = EvaluateReport(target)
    lease = GridLease(grid_dir, grid.name)
    lease.acquire(f"evaluate-{os.getpid()}-{int(time.time())}")
    try:
        for spec in chosen:
            _evaluate_trial(grid, grid_dir, spec, target, job, uri, report, set(steps or ()))
    finally:
        lease.release()
    return report


def _check_job(grid: GridSpec, chosen: list[TrialSpec], job: _Job) -> None:
    """Before anything runs: this machine runs the evaluation pool's jobs, and each chosen
    trial trained the model the grid's shared config loads (a trial recorded by another grid
    file may not)."""
    evaluator = backend(chosen[0].backend).evaluator(job.pool)
    evaluator.require_job(job.pool, job.shared, where=f"{grid.file}: eval.pool {job.pool.name}")
    shared = dict(recipes.flatten(job.shared))
    for spec in chosen:
        own = recipes.flatten(grid.trial_config(spec))
        for key, value in own:
            if key.startswith(evaluator.job_model_keys) and shared.get(key) != value:
                raise UserError(f"{grid.file}: trial {spec.trial_id} sets {key} = {value!r}, "
                                "and the engine reference loads the grid's "
                                f"{shared.get(key)!r} for every arm; fix: leave the trial out "
                                "(--trial) or evaluate it with the grid file it ran under")


def _evaluate_trial(grid: GridSpec, grid_dir: Path, spec: TrialSpec, target: str,
                    job: _Job | None, uri: str, report: EvaluateReport, only: set[int]) -> None:
    from filelock import Timeout  # deferred: as records.run_lock defers filelock

    paths = TrialPaths(grid_dir, spec.trial_id)
    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        report.skipped[spec.trial_id] = "its run lock is held: it is running; evaluate it later"
        return
    try:
        runs = backend(spec.backend)
        pool = grid.pools.get(spec.pool)
        evaluator = runs.evaluator(job.pool if job else pool)
        version = (str(evaluator.version) if job is None else evaluation.job_evaluator(
            str(evaluator.job_version), job.pool.name, job.rollout))
        held = read_reference(paths)
        if held is None or (held.target, held.evaluator) != (target, version):
            held = ReferenceScores(target, version)  # another evaluator's scores are replaced
        if job is not None:  # the job holds the evaluation pool's accelerators
            held.rate = pool_rate(job.pool)
        logged = {s for s, row in records.iter_metrics(paths.metrics) if M.EVAL_REWARD_REF in row} \
            if paths.metrics.exists() and job is None else set()
        ck = grid.spec.checkpoint
        store = CheckpointStore.for_trial(ck.store, paths.root, spec.trial_id, ck.keep)
        todo = [s for s in store.steps() if s not in logged and s not in held.scores
                and (not only or s in only)]
        damaged = [f"step {s} is damaged ({why})" for s, why in store.damaged().items()
                   if s not in logged and s not in held.scores and (not only or s in only)]
        if damaged:
            report.damaged[spec.trial_id] = damaged
        config = grid.trial_config(spec)
        done = report.scored.setdefault(spec.trial_id, [])
        with workspace.scoped_environ(runs.worker_env(config)):
            for step in todo:
                t0 = time.perf_counter()
                try:
                    ckpt = store.path(step)  # verified by its hashes
                except CheckpointError as exc:
                    report.damaged.setdefault(spec.trial_id, []).append(f"step {step}: {exc}")
                    continue
                if job is None:
                    value = evaluator.score(spec, config, pool, ckpt, step, target)
                else:
                    try:
                        value = _run_job(runs, evaluator, job, grid_dir, spec, ckpt, step)
                    except (InfraFailure, CheckpointError) as exc:
                        report.failed[spec.trial_id] = f"step {step}: {exc}"
                        break
                seconds = time.perf_counter() - t0
                held.scores[step] = (value, seconds)
                write_reference(paths, held)
                done.append(step)
                report.seconds += seconds
        _send(paths, held, uri, report)
    finally:
        lock.release()


def _run_job(runs: Backend, evaluator: Evaluator, job: _Job, grid_dir: Path, spec: TrialSpec,
             checkpoint: Path, step: int) -> float:
    """One evaluation job on the job's pool; its evidence (every validation metric it logged,
    the engine that ran) kept beside its logs as ``evidence.json``."""
    problem = runs.problem(TrialConfig.of(job.shared, job.pool), frozenset({"checkpoint"}),
                           checkpoint=checkpoint)
    if problem:
        raise CheckpointError(f"its checkpoint is {problem}")
    root = TrialPaths(grid_dir, spec.trial_id).root
    logs = root / "logs" / f"reference-step-{step}"
    value, evidence = evaluator.score_job(spec, job.shared, job.pool, job.rollout, checkpoint,
                                          step, grid_dir=grid_dir, log_dir=logs,
                                          workdir=root / "work" / logs.name)
    atomic_write_json(logs / "evidence.json", {"step": step, "pool": job.pool.name,
                                               "rollout": job.rollout, **evidence})
    return value


def _send(paths: TrialPaths, held: ReferenceScores, uri: str, report: EvaluateReport) -> None:
    """Log the scores MLflow has not taken yet to the trial's run (its record names it), and
    tag the run with their evaluator: MLflow keeps the points of an evaluator these replaced
    (``reference.json`` does not), so the tag says whose the newest points are."""
    run_id = records.load_state(paths, paths.root.name).mlflow_run_id

    def send(run: str, values: dict[int, float]) -> None:
        log_steps(uri, run, M.EVAL_REWARD_REF, values)
        client(uri).set_tag(run, EVALUATOR_TAG, held.evaluator)

    report.unsent += send_reference(paths, held, run_id, send)
