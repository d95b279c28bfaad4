"""One Miles attempt: ``python3 train.py ARGS`` (through ``orchestrator.miles.entry``) as the
driver of a Ray cluster on the pool's GPUs, its metrics and checkpoints followed through the
trial's ``MilesJob``. Two places to run it, one watch:

* launched from here (``backend: miles``): a Ray job on the pool's Ray cluster (``ray job
  submit ... -- python3 train.py ARGS``, the way Miles' own scripts start a run), submitted and
  watched through Ray's job SDK; the pool names the job server (``miles.ray_address``);
* inside a Slurm allocation (``backend: slurm-miles``, the run context offers ``ray_cluster``):
  Ray is started on every node of the allocation (``slurm.raycluster``, one node per Slurm
  node, the pool's GPUs each) and the command runs on the batch node as the cluster's driver
  (``RAY_ADDRESS``), with the job's Python: the Ray that started the nodes is the driver's.

The job writes its TensorBoard files and checkpoints under this attempt's folders, so the
cluster's nodes and this process must share that filesystem (one node, or a shared volume, as
on a Slurm or Kubernetes cluster). Stop and early stop end the job; a job that fails is an
infrastructure failure with its log's tail.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
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
    spread = getattr(ctx, "ray_cluster", None)
    if spread is not None:
        return _in_allocation(spread, argv, env, job, trial, ctx, ckpt_dir, tb_dir)
    from ray.job_submission import JobSubmissionClient  # deferred: see require

    server = str(config.pool.miles["ray_address"])
    try:
        client = JobSubmissionClient(server)
        job_id = client.submit_job(entrypoint=shlex.join(argv), runtime_env={"env_vars": env},
                                   submission_id=f"ablate-{trial.trial_id}-{ctx.attempt}")
    except (ConnectionError, RuntimeError) as exc:  # the SDK's errors: refused, 5xx, no agent
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InfraFailure(f"the Ray job server {server} did not take the job: {first}") from None
    ctx.describe_environment({"miles.ray_job": job_id, "miles.ray_address": server})
    return _watch(_RayJob(client, job_id), job, trial, ctx, ckpt_dir, tb_dir)


def _in_allocation(spread: Any, argv: list[str], env: dict[str, str], job: MilesJob,
                   trial: TrialSpec, ctx: RunContext, ckpt_dir: Path,
                   tb_dir: Path) -> AttemptResult:
    """Ray on every node of this Slurm allocation, then the command as its driver here."""
    pool = ctx.pool
    # Ray's workers inherit their raylet's environment, not the driver's: the nodes get it too.
    full = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_RUN_ID")},
            **env}
    log = Path(ctx.log_dir) / f"miles.attempt{ctx.attempt}.log"
    tag = f"{trial.trial_id[-6:]}{ctx.attempt}"
    with spread(full, log_dir=Path(ctx.log_dir), num_cpus=None, num_gpus=pool.gpus_per_node,
                tag=tag) as (address, nodes):
        ctx.describe_environment({"miles.ray_address": address, "ray.nodes": ",".join(nodes)})
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, *argv[1:]], env={**full, "RAY_ADDRESS": address},
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # its own group: stop ends it all
        driver = _Driver(proc, log)
        try:
            return _watch(driver, job, trial, ctx, ckpt_dir, tb_dir)
        finally:
            driver.stop()


class _RayJob:
    """A Ray job as :func:`_watch` follows it (Ray's job SDK)."""

    def __init__(self, client: Any, job_id: str) -> None:
        self.client, self.name = client, f"Miles job {job_id}"
        self.job_id = job_id

    def status(self) -> str:
        return str(self.client.get_job_status(self.job_id)).rsplit(".", 1)[-1]

    def stop(self) -> None:
        self.client.stop_job(self.job_id)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and self.status() not in DONE:
            time.sleep(0.5)

    def log_tail(self) -> list[str]:
        return str(self.client.get_job_logs(self.job_id))[-2000:].strip().splitlines()


class _Driver:
    """The command run here as the Ray cluster's driver, as :func:`_watch` follows it."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log, self.name = proc, log, f"Miles driver (pid {proc.pid})"

    def status(self) -> str:
        code = self.proc.poll()
        return "RUNNING" if code is None else "SUCCEEDED" if code == 0 else "FAILED"

    def stop(self) -> None:
        """SIGTERM the driver's process group, SIGKILL what is left after a grace period."""
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)

    def log_tail(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace")[-2000:].strip().splitlines()
        except OSError:
            return []


def _watch(run: _RayJob | _Driver, job: MilesJob, trial: TrialSpec, ctx: RunContext,
           ckpt_dir: Path, tb_dir: Path) -> AttemptResult:
    tail = job.metrics(tb_dir, ctx.resume_step or 0)
    saved = fed = ctx.resume_step or 0
    stop_reason = None
    while True:
        status = run.status()
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
            run.stop()
            return AttemptResult(AttemptOutcome.STOPPED, fed, reason=stop_reason)
        time.sleep(POLL_SECONDS)
    if stop_reason:
        return AttemptResult(AttemptOutcome.STOPPED, fed, reason=stop_reason)
    if status != "SUCCEEDED":
        log = run.log_tail()
        raise InfraFailure(f"{run.name} {status.lower()} after step {fed}: "
                           + (log[-1] if log else "no log"))
    if fed < trial.steps:
        raise InfraFailure(f"{run.name} ended after step {fed} of {trial.steps} (a "
                           f"step was not logged to {tb_dir})")
    return AttemptResult(AttemptOutcome.COMPLETED, fed)
