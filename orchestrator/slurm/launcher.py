"""The Slurm launcher: each attempt of a trial is one ``sbatch`` job in its pool's place.

The job runs the trial's trainer (the registry gives ``SimTrainer`` on a sim pool,
``VerlTrainer`` on a cpu or gpu pool; ``MilesTrainer`` for ``backend: slurm-miles``) through ``orchestrator.slurm.worker``; this module, in the
Tune trial, submits the job and follows it as ``k8s.launcher`` follows a RayJob: the job's
``events.jsonl`` records are fed to the run context (metrics, checkpoints, environment), ``ctx.should_stop()`` (early stop,
``ablate cancel``) becomes ``scancel``, and a job the cluster ended (NODE_FAIL, a node set
down, TIMEOUT, PREEMPTED, a requeue) raises ``InfraFailure``: the scheduler retries the trial
from its last checkpoint with a new job.

A trial has at most one live job: before submitting, the launcher cancels any job of the same
trial and workdir still in the queue (an orchestrator that was SIGKILLed leaves its jobs
running; the re-submission takes their trials over from the last checkpoint).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.base import (
    PLAN,
    AttemptOutcome,
    AttemptResult,
    Launcher,
    Problem,
    RunContext,
    Trainer,
    problem,
)
from orchestrator.backends.config import TrialConfig
from orchestrator.backends.short import ShortJob
from orchestrator.exceptions import (
    BackendUnavailableError,
    CheckpointError,
    InfraFailure,
    Preempted,
    UserError,
)
from orchestrator.pools import PoolSpec
from orchestrator.slurm import client as sc
from orchestrator.slurm.checks import nodes_problem, placement_problem
from orchestrator.slurm.events import EventReader
from orchestrator.slurm.poller import shared_poller
from orchestrator.slurm.script import extra_problem, job_name, sbatch_options, script_text
from orchestrator.slurm.worker import JOB, STOP
from orchestrator.trial import TrialSpec

log = logging.getLogger(__name__)


class SlurmLauncher(Launcher):
    """Trials as Slurm batch jobs: sim pools run the simulator, cpu/gpu pools verl (or Miles)."""

    name: ClassVar[str] = "slurm"
    # The job's numbers are its trainer's; a trial id hashes this plus the trainers' versions
    # (``backends.Backend.identity``).
    version: ClassVar[str | None] = "slurm-1"
    pool_kinds: ClassVar[tuple[str, ...] | None] = ("sim", "cpu", "gpu")
    poll_seconds: ClassVar[float] = 1.0
    computes_elsewhere: ClassVar[bool] = True

    def __init__(self, *, client: Any = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._sleep = sleep

    # ------------------------------------------------------------------ plan time

    @classmethod
    def problems(cls, trainer: type[Trainer], config: TrialConfig, *,
                 stages: frozenset[str] = PLAN) -> list[Problem]:
        """The pool's ``slurm.extra`` may not give an option the launcher owns (``pool``); the
        node count, which needs no cluster and is wrong on any, then the placement (``config``)."""
        found: list[Problem] = []
        if "pool" in stages:
            pool_problem = extra_problem(config.pool)
            found += [] if pool_problem is None else [Problem("pool", pool_problem[1],
                                                              pool_problem[0])]
        if "config" in stages:
            found += problem("config", nodes_problem(trainer.job(config), config.pool)
                             or placement_problem(config.pool, reachable_only=True))
        return found

    @classmethod
    def describe(cls, trial: TrialSpec, pool: PoolSpec) -> list[str]:
        name = f"ablate-{trial.trial_id}-WORKDIR"
        return [f"#SBATCH {o}" for o in sbatch_options(pool, name=name)]

    @classmethod
    def worker_env(cls, trainer: type[Trainer],
                   config: Mapping[str, Any]) -> dict[str, str | None]:
        """None: the trainer's environment goes into each job's script, not the watchers'."""
        return {}

    @classmethod
    def require(cls, trainer: type[Trainer], pools: Iterable[PoolSpec], *,
                where: str = "") -> None:
        missing = sc.missing_clients()
        if missing:
            raise BackendUnavailableError(f"{where}: backend slurm needs {', '.join(missing)} "
                                          f"on this machine; fix: {sc.INSTALL}")
        for pool in pools:
            problem = placement_problem(pool, reachable_only=False)
            if problem:
                raise UserError(f"{where}: {problem}")

    @classmethod
    def dry_run(cls, grid_path: str, *, out_dir: str | None, force: bool,
                workdir: str | None, backend: str = "slurm") -> int:
        """Every trial's job script (``slurm/dryrun.py``)."""
        from orchestrator.slurm.dryrun import dry_run  # deferred: it loads grids, above launchers

        return int(dry_run(grid_path, out_dir=out_dir, force=force, workdir=workdir,
                           backend_name=backend) or 0)

    @classmethod
    def abandon(cls, trial_id: str, log_dir: Path) -> None:
        """``scancel`` the trial's jobs still queued or running (a killed orchestrator's)."""
        if sc.missing_clients():
            return
        client = sc.SlurmClient()
        for job in client.jobs_named(job_name(trial_id, log_dir)):
            client.cancel(job)

    @classmethod
    def run_short(cls, jobs: Sequence[ShortJob], *, parallel: int,
                  limits: Mapping[str, int]) -> None:
        """Each job a Slurm job on its pool's partition, in parallel (``slurm/short.py``; a
        missing sbatch is the client's one-line refusal)."""
        from orchestrator.slurm.short import run_short  # deferred: only a probe asks

        run_short(jobs, parallel=parallel, limits=limits)

    # ------------------------------------------------------------------ one attempt

    def run(self, trainer: Trainer, trial: TrialSpec, config: TrialConfig,
            ctx: RunContext) -> AttemptResult:
        client = self._client or sc.SlurmClient()
        job_dir = Path(ctx.log_dir) / f"slurm-attempt-{ctx.attempt}"
        shutil.rmtree(job_dir, ignore_errors=True)  # a try of this attempt that never started
        job_dir.mkdir(parents=True)
        name = job_name(trial.trial_id, ctx.log_dir)
        _cancel_leftovers(client, name, self._sleep)
        for old in Path(ctx.log_dir).glob("slurm-attempt-*"):  # copies a killed watch left
            for sub in ("ckpt", "work"):
                shutil.rmtree(old / sub, ignore_errors=True)
        script = _write_job(type(trainer), trial, config, ctx, job_dir, name)
        job_id = client.submit(str(script), pool=ctx.pool.name,
                               output=str(job_dir / "slurm-%j.out"))
        (job_dir / "job-id").write_text(job_id + "\n")
        # The job's state comes from the poller all this orchestrator's watchers share (one
        # squeue for all their jobs per refresh, backing off while nothing changes).
        status = shared_poller(self._client)
        follow = _Follow(client, job_id, job_dir, ctx, self._sleep, self.poll_seconds, status)
        try:
            return follow.run()
        except BaseException:
            # Whatever ended our watch (a requeue, an error, an interrupt), the job must not
            # run on unobserved: a retry submits a new one.
            sc.cancel_quietly(client, job_id)
            raise
        finally:
            _forget_quietly(status, job_id)
            for sub in ("ckpt", "work"):  # the job's copies; events and logs stay as evidence
                shutil.rmtree(job_dir / sub, ignore_errors=True)


def _write_job(trainer: type[Trainer], trial: TrialSpec, config: TrialConfig,
               ctx: RunContext, job_dir: Path, name: str) -> Path:
    """The attempt's ``job.json`` (all the job needs, as data) and its job script."""
    spec = {"trial": trial.to_json(), "config": config.to_json(), "attempt": ctx.attempt,
            "trainer": [trainer.__module__, trainer.__qualname__],
            "checkpoint_every": ctx.checkpoint_every, "resume_step": ctx.resume_step,
            "resume_path": (str(ctx.checkpoint_path(ctx.resume_step))
                            if ctx.resume_step else None)}
    tmp = job_dir / (JOB + ".tmp")
    tmp.write_text(json.dumps(spec, default=list))
    os.replace(tmp, job_dir / JOB)
    script = job_dir / "job.sbatch"
    script.write_text(script_text(trainer, config, ctx.pool, job_dir, name))
    return script


class _Follow:
    """Feeds one job's events to the run context until the job ends or must stop. The job's
    state is asked of ``status`` (a ``poller.StatusPoller`` or its Ray actor's handle; the
    client itself, one ``scontrol`` per poll, when None)."""

    def __init__(self, client: Any, job_id: str, job_dir: Path, ctx: RunContext,
                 sleep: Callable[[float], None], poll: float, status: Any = None) -> None:
        self.client, self.job_id, self.job_dir, self.ctx = client, job_id, job_dir, ctx
        self.status = status if status is not None else client
        self.sleep, self.poll = sleep, poll
        self.events = EventReader(job_dir)
        self.last = ctx.resume_step or 0
        self.facts: dict[str, str] = {"slurm.job_id": job_id, "slurm.partition":
                                      (ctx.pool.slurm.partition or "") if ctx.pool.slurm else ""}
        self.end: dict[str, Any] | None = None
        # Why the run context asked the attempt to stop, once it has (``_drain``).
        self.stopping: str | None = None
        # Restarts the job's own "start" record reports: a requeue seen before the poller's
        # next refresh shows it (that may be up to poller.MAX_S away).
        self.restarts = 0
        self._unknown_at: float | None = None
        # How long a job may be unknown to squeue/scontrol/sacct before it counts as lost.
        self.forget_s = 30.0
        ctx.describe_environment(self.facts)

    def run(self) -> AttemptResult:
        while True:
            state = self.status.state(self.job_id)
            if state is not None:
                self._unknown_at = None
            if state is not None and state.state != self.facts.get("slurm.state"):
                # Where the job is (PENDING and why, RUNNING): attempts.json and MLflow tags.
                self.facts["slurm.state"] = state.state
                self.facts["slurm.reason"] = state.reason
                self.ctx.describe_environment(self.facts)
            self._drain()
            if self.stopping:
                return self._stop()
            if self.end is not None:
                return self._ended()
            if (state is not None and state.restarts) or self.restarts:
                what = (state.describe() if state is not None and state.restarts
                        else f"restart {self.restarts}, by the job's start record")
                raise InfraFailure(f"infra_failure: Slurm requeued job {self.job_id} after step "
                                   f"{self.last} ({what}); retried from the last "
                                   "checkpoint as a new job")
            if state is None and self._unknown_since(time.monotonic()) < self.forget_s:
                pass  # a controller restarting, or a job that just ended and whose record lags
            elif state is None or state.finished:
                self._drain()
                if self.stopping:
                    return self._stop()
                if self.end is not None:
                    return self._ended()
                what = state.describe() if state else "unknown to squeue, scontrol and sacct"
                error = (Preempted if state and state.state in sc.PREEMPTION else InfraFailure)
                raise error(f"infra_failure: Slurm job {self.job_id} ended after step "
                            f"{self.last}: {what}{self._log_tail()}")
            self.stopping = self.ctx.should_stop()
            if self.stopping:
                return self._stop()
            self.sleep(self.poll)

    def _stop(self) -> AttemptResult:
        """The run context asked the attempt to stop (an early stop, a warning the rescue policy
        acts on, a cancel): the job is told and cancelled; the attempt ends at the last step fed."""
        (self.job_dir / STOP).touch()
        self.client.cancel(self.job_id)
        return AttemptResult(AttemptOutcome.STOPPED, self.last, self.stopping)

    def _unknown_since(self, now: float) -> float:
        """Seconds the job has been unknown to Slurm (0 when it was known at the last poll)."""
        if self._unknown_at is None:
            self._unknown_at = now
        return now - self._unknown_at

    def _drain(self) -> None:
        """Feed the job's new events to the run context. A job runs ahead of the orchestrator
        (a short sim job may have ended by the first poll): once the context asks to stop, as
        an in-process trainer asks before each step, no later step is fed (that step's
        checkpoint still is), so the attempt ends where it would have in-process."""
        for ev in self.events.poll():
            kind = ev.get("type")
            if kind == "metrics":
                self.stopping = self.stopping or self.ctx.should_stop()
                if self.stopping:
                    return
                self.ctx.log_metrics(int(ev["step"]), ev["metrics"])
                self.last = int(ev["step"])
            elif kind == "checkpoint":
                src = Path(ev["path"])
                self.ctx.save_checkpoint(int(ev["step"]), functools.partial(_copy, src))
                shutil.rmtree(src, ignore_errors=True)
            elif kind == "environment":
                self.facts.update(ev["facts"])
                self.ctx.describe_environment(self.facts)
            elif kind == "start":
                self.facts["slurm.node"] = str(ev.get("node"))
                self.restarts = max(self.restarts, int(ev.get("restarts") or 0))
            elif kind in ("result", "error"):
                self.end = ev

    def _ended(self) -> AttemptResult:
        end = self.end or {}
        if end.get("type") == "error":
            msg = str(end.get("message"))
            if end.get("kind") == "user":
                raise UserError(msg)
            if end.get("kind") == "checkpoint":
                raise CheckpointError(msg)
            raise InfraFailure(f"infra_failure: in Slurm job {self.job_id}: {msg}"
                               f"{self._log_tail()}")
        return AttemptResult(AttemptOutcome(end["outcome"]), int(end["last_step"]),
                             end.get("reason"), end.get("summary") or {})

    def _log_tail(self, lines: int = 5) -> str:
        logs = sorted(self.job_dir.glob("slurm-*.out"))
        if not logs:
            return ""
        tail = [ln for ln in logs[-1].read_text(errors="replace").splitlines() if ln.strip()]
        return ("; job log: " + " | ".join(tail[-lines:])) if tail else ""


def _copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)


def _forget_quietly(status: Any, job_id: str) -> None:
    try:
        status.forget(job_id)
    except Exception:  # the poller drops jobs nobody asks about anyway
        log.exception("could not tell the Slurm status poller to forget job %s", job_id)


def _cancel_leftovers(client: Any, name: str, sleep: Callable[[float], None],
                      timeout: float = 60.0) -> None:
    """Cancel this trial's jobs still queued or running (an earlier orchestrator's) and wait
    until Slurm has ended them, so the trial never runs twice at once."""
    jobs = client.jobs_named(name)
    for job in jobs:
        log.warning("cancelling Slurm job %s (%s) left by an earlier submission", job, name)
        client.cancel(job)
    deadline = time.monotonic() + timeout
    while jobs and time.monotonic() < deadline:
        sleep(0.5)
        jobs = client.jobs_named(name)
    if jobs:
        raise InfraFailure(f"infra_failure: Slurm jobs {', '.join(jobs)} of {name} did not end "
                           f"{timeout:.0f} s after scancel")
