"""One Miles attempt launched from here: a Ray job on the pool's Ray cluster (``ray job submit
... -- python3 train.py ARGS``, the way Miles' own scripts start a run), submitted and watched
through Ray's job SDK, its metrics and checkpoints followed through the trial's ``MilesJob``.

The job writes its TensorBoard files and checkpoints under this attempt's folders, so the
cluster's nodes and this process must share that filesystem (one node, or a shared volume, as
on a Slurm or Kubernetes cluster). Stop and early stop end the job (``stop_job``); a job that
fails is an infrastructure failure with its log's tail.
"""
from __future__ import annotations

import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.backends.base import AttemptOutcome, AttemptResult, RunContext
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import BackendUnavailableError, InfraFailure
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.miles.job import MilesJob

POLL_SECONDS = 2.0
DONE = ("SUCCEEDED", "FAILED", "STOPPED")


def require(pools: Iterable[PoolSpec], *, where: str = "") -> None:
    """Each pool names its Ray cluster's job server, and Ray's job SDK is importable here."""
    for pool in pools:
        if not pool.miles.get("ray_address"):
            raise BackendUnavailableError(
                f"{where}: pool {pool.name} names no Ray cluster for Miles runs; fix: set "
                f"miles: {{ray_address: http://HEAD:8265}} on pool {pool.name} (the job server "
                "of a Ray cluster on its GPUs)")
    try:
        import ray.job_submission  # noqa: F401  deferred: ray only where a run is launched
    except ImportError as exc:
        raise BackendUnavailableError(f"{where}: Ray's job SDK is missing ({exc}); fix: pip "
                                      "install 'ray[default]'") from None


def run_attempt(trainer: Any, trial: TrialSpec, config: TrialConfig,
                ctx: RunContext) -> AttemptResult:
    from ray.job_submission import JobSubmissionClient  # deferred: see require

    job = trainer.job(config)
    ckpt_dir = ctx.workdir / "miles-save"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tb_dir = ctx.log_dir / f"tensorboard-{ctx.attempt}"
    resume = job.resume_path(ctx, ckpt_dir)
    argv = job.command(trial, checkpoint_dir=str(ckpt_dir), resume_path=resume,
                       save_freq=ctx.checkpoint_every)
    env = {k: v for k, v in job.environment(trial, tracking_uri=None, run_id=None,
                                            file_logger_path=str(tb_dir)).items()
           if v is not None}
    client = JobSubmissionClient(str(config.pool.miles["ray_address"]))
    job_id = client.submit_job(entrypoint=shlex.join(argv), runtime_env={"env_vars": env},
                               submission_id=f"ablate-{trial.trial_id}-{ctx.attempt}")
    ctx.describe_environment({"miles.ray_job": job_id,
                              "miles.ray_address": str(config.pool.miles["ray_address"])})
    return _watch(client, job_id, job, trial, ctx, ckpt_dir, tb_dir)


def _watch(client: Any, job_id: str, job: MilesJob, trial: TrialSpec, ctx: RunContext,
           ckpt_dir: Path, tb_dir: Path) -> AttemptResult:
    tail = job.metrics(tb_dir, ctx.resume_step or 0)
    saved = fed = ctx.resume_step or 0
    stop_reason = None
    while True:
        status = str(client.get_job_status(job_id)).rsplit(".", 1)[-1]
        finished = status in DONE
        for step, data in (tail.flush() if finished else tail.poll()):
            stop_reason = stop_reason or ctx.should_stop()
            if stop_reason:
                break  # the job runs ahead of this loop: later steps are not recorded
            ctx.log_metrics(step, data)
            fed = step
        saved = job.hand_over(ctx, ckpt_dir, saved, fed)
        if finished:
            break
        stop_reason = stop_reason or ctx.should_stop()
        if stop_reason:
            client.stop_job(job_id)
            _wait_done(client, job_id)
            return AttemptResult(AttemptOutcome.STOPPED, fed, reason=stop_reason)
        time.sleep(POLL_SECONDS)
    if stop_reason:
        return AttemptResult(AttemptOutcome.STOPPED, fed, reason=stop_reason)
    if status != "SUCCEEDED":
        log = client.get_job_logs(job_id)[-2000:].strip().splitlines()
        raise InfraFailure(f"Miles job {job_id} {status.lower()} after step {fed}: "
                           + (log[-1] if log else "no log"))
    if fed < trial.steps:
        raise InfraFailure(f"Miles job {job_id} ended after step {fed} of {trial.steps} (a "
                           f"step was not logged to {tb_dir})")
    return AttemptResult(AttemptOutcome.COMPLETED, fed)


def _wait_done(client: Any, job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if str(client.get_job_status(job_id)).rsplit(".", 1)[-1] in DONE:
            return
        time.sleep(0.5)
