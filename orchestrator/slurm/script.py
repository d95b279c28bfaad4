"""A trial's Slurm job: sbatch options from its pool's ``slurm:`` block and a job script that
runs one argument list.

Grid values never become shell text: the pool block's values are single tokens (checked by
``pools.SlurmPlacement``) that sbatch itself parses from ``#SBATCH`` lines, and every word of
the command and every environment value is ``shlex.quote``d.
"""
from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Trainer
from orchestrator.pools import PoolSpec

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout the job imports from


def job_name(trial_id: str, grid_dir: str | Path) -> str:
    """One name per trial and workdir: ``squeue -n`` finds a trial's jobs after a restart, and
    the same trial in another workdir is another job."""
    where = hashlib.sha256(str(Path(grid_dir).resolve()).encode()).hexdigest()[:6]
    return f"ablate-{trial_id}-{where}"


# sbatch options the launcher sets itself (``sbatch_options``, ``SlurmClient.submit``) or that
# would break one job per attempt: a pool's ``slurm.extra`` may not give them. ``--partition``
# there would run a trial elsewhere than its records say, ``--array`` one attempt twice into one
# events file, ``--job-name`` hide the job from ``ablate cancel``.
OWNED_OPTIONS = frozenset({
    "job-name", "nodes", "ntasks-per-node", "ntasks", "partition", "constraint", "gres",
    "account", "qos", "time", "cpus-per-task", "gpus-per-node", "gpus", "output", "error",
    "array", "chdir", "export", "wrap", "parsable", "test-only", "open-mode", "hold",
})  # fmt: skip


def extra_problem(pool: PoolSpec) -> tuple[str, str] | None:
    """An option of the pool's ``slurm.extra`` that the launcher owns: (the pool key, why)."""
    for opt in pool.slurm.extra if pool.slurm is not None else ():
        name = opt[2:].split("=", 1)[0]
        if name in OWNED_OPTIONS:
            block = {"time": "time_limit", "cpus-per-task": "cpus_per_task"}.get(name, name)
            where = (f"the pool's slurm.{block}" if block in type(pool.slurm).model_fields
                     else "the launcher")
            return "slurm", (f"pool {pool.name}: slurm.extra {opt!r}: --{name} is set by {where} "
                             "for every job of the pool; fix: drop it from extra"
                             + (f" (set slurm.{block} instead)" if where != "the launcher" else ""))
    return None


def sbatch_options(pool: PoolSpec, *, name: str) -> list[str]:
    """The sbatch options that place one trial of ``pool``: its ``slurm:`` block, its node
    count and, for a GPU pool without a ``gres``, its GPUs per node. (The job's log path goes
    on sbatch's command line: a path with a space would not survive an ``#SBATCH`` line.)"""
    s = pool.slurm
    opts = [f"--job-name={name}", f"--nodes={pool.nodes}", "--ntasks-per-node=1"]
    if s is not None:
        for key, value in (("partition", s.partition), ("constraint", s.constraint),
                           ("gres", s.gres), ("account", s.account), ("qos", s.qos),
                           ("time", s.time_limit), ("cpus-per-task", s.cpus_per_task)):
            if value is not None:
                opts.append(f"--{key}={value}")
        opts.extend(s.extra)
    if pool.kind == "gpu" and (s is None or s.gres is None) and pool.gpus_per_node:
        opts.append(f"--gpus-per-node={pool.gpus_per_node}")
    return opts


def job_script(options: Sequence[str], argv: Sequence[str], *,
               env: Mapping[str, str | None] | None = None, cwd: str | None = None) -> str:
    """A bash job script: ``#SBATCH`` lines, the environment, then ``exec argv``."""
    lines = ["#!/bin/bash", "# Written by ablate (orchestrator/slurm/script.py)."]
    lines += [f"#SBATCH {opt}" for opt in options]
    lines.append("set -euo pipefail")
    for key, value in sorted((env or {}).items()):
        lines.append(f"unset {key}" if value is None else f"export {key}={shlex.quote(value)}")
    if cwd:
        lines.append(f"cd {shlex.quote(cwd)}")
    lines.append("exec " + shlex.join(argv))
    return "\n".join(lines) + "\n"


def worker_argv(job_dir: str | Path) -> list[str]:
    """What the job runs: this Python, the in-job worker, the attempt's job directory."""
    return [sys.executable, "-m", "orchestrator.slurm.worker", str(job_dir)]


def base_env() -> dict[str, str | None]:
    """The job finds this checkout first (shared filesystem) and no MLflow run of ours: the
    orchestrator, not the job, writes the trial's MLflow run."""
    import os

    path = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "MLFLOW_RUN_ID": None, "PYTHONUNBUFFERED": "1"}


def script_text(trainer: type[Trainer], config: Mapping[str, Any], pool: PoolSpec,
                job_dir: Path, name: str) -> str:
    """The job script of an attempt whose job directory is ``job_dir``: the pool's sbatch
    options, the trainer's environment (its ``environment``), and the worker."""
    env = {**base_env(), **trainer.environment(config)}
    return job_script(sbatch_options(pool, name=name), worker_argv(job_dir), env=env,
                      cwd=str(job_dir))
