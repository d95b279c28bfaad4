"""Short jobs (a probe's, ``backends.short``) as Slurm batch jobs: each on its pool's partition
with the pool's sbatch options, as a trial's attempt would be, at most ``parallel`` queued at
once and a pool's limit of them, followed until every one has ended.

The job script runs ``python -m MODULE JOB_DIR`` with the trainer's environment; the job's result
(or its one-line error) is in ``JOB_DIR``, which must be on a file system the nodes share (the
workdir, as for trials). An interrupt or an error here cancels the jobs still queued or running.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.backends.short import ShortJob, limit_of
from orchestrator.slurm import client as sc
from orchestrator.slurm.script import base_env, job_name, job_script, sbatch_options

SAY_EVERY_S = 60.0  # how often a wait for the jobs says what Slurm says of them
UNKNOWN_GRACE_S = 30.0  # a job Slurm does not know for this long has gone (as the launcher's)


def _submit(client: Any, job: ShortJob) -> str:
    script = job.job_dir / "job.sbatch"
    options = sbatch_options(job.config.pool, name=job_name(f"short-{job.name}", job.job_dir))
    script.write_text(job_script(options, job.argv(), env={**base_env(), **job.environment},
                                 cwd=str(job.job_dir)))
    job_id = client.submit(str(script), pool=job.config.pool.name,
                           output=str(job.job_dir / "slurm-%j.out"))
    (job.job_dir / "job-id").write_text(job_id + "\n")
    return job_id


def run_short(jobs: Sequence[ShortJob], *, parallel: int, limits: Mapping[str, int],
              client: Any = None, sleep: Callable[[float], None] = time.sleep,
              poll: float = 1.0) -> None:
    """Run ``jobs`` as Slurm jobs (module docstring); raise the first failure once all ended."""
    client = client or sc.SlurmClient()
    waiting = list(jobs)
    running: dict[str, ShortJob] = {}
    ended: list[tuple[ShortJob, str]] = []
    said = time.monotonic()
    unknown: dict[str, float] = {}  # job id -> when Slurm first did not know it
    try:
        while waiting or running:
            for job in list(waiting):
                pool = job.config.pool.name
                busy = sum(j.config.pool.name == pool for j in running.values())
                if len(running) < parallel and busy < limit_of(limits, job.config):
                    running[_submit(client, job)] = job
                    waiting.remove(job)
            states = client.states(list(running))
            for job_id, job in list(running.items()):
                state = states.get(job_id)
                if state is None:  # neither squeue nor sacct knows it: gone, after a grace
                    unknown.setdefault(job_id, time.monotonic())
                    if time.monotonic() - unknown[job_id] < UNKNOWN_GRACE_S:
                        continue
                if state is None or state.finished:
                    how = state.describe() if state else "gone from the queue"
                    ended.append((job, f"Slurm job {job_id}: {how}"))
                    del running[job_id]
            if running and time.monotonic() - said >= SAY_EVERY_S:  # queued, not hung
                said = time.monotonic()
                print(f"waiting for {len(running) + len(waiting)} Slurm job(s): " + ", ".join(
                    f"{j} {states[j].describe() if j in states else 'submitted'}"
                    for j in running), file=sys.stderr, flush=True)
            if running:
                sleep(poll)
    except BaseException:
        for job_id in running:  # no job runs on unobserved
            sc.cancel_quietly(client, job_id)
        raise
    for job, how in ended:
        job.check_ended(how)

