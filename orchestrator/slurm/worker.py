"""What a trial's Slurm job runs: ``python -m orchestrator.slurm.worker JOB_DIR``.

It runs one attempt of the trial's trainer (the simulator on a sim pool, verl on a cpu or gpu
pool, Miles for ``backend: slurm-miles``; ``job.json`` names it) with a ``FileContext``: metrics, checkpoints and the outcome go to
``JOB_DIR`` as ``events`` records, which the orchestrator's ``SlurmLauncher`` reads and feeds to the real run
context (metrics.jsonl, the checkpoint store, verdicts, MLflow). So the job keeps no trial
state of its own: a job killed with its node loses nothing that was recorded, and the retry is
the scheduler's usual one, from the last checkpoint.

A job that Slurm requeued (``SLURM_RESTART_COUNT`` > 0) does not train: the orchestrator saw
the requeue, cancels it and starts a new attempt from its own last checkpoint.
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import CheckpointError, UserError
from orchestrator.slurm import raycluster
from orchestrator.slurm.events import EventWriter
from orchestrator.trial import TrialSpec

JOB = "job.json"
STOP = "stop"  # the orchestrator asks the job to stop by creating this file (and scancel)


class FileContext:
    """The RunContext of an attempt inside a Slurm job (``backends.base.RunContext``)."""

    def __init__(self, job_dir: Path, spec: Mapping[str, Any], events: EventWriter) -> None:
        self.job_dir = job_dir
        self.trial = TrialSpec.from_json(spec["trial"])
        self.config = TrialConfig.from_json(spec["config"])  # read back into the one type
        self.pool = self.config.pool
        self.attempt = int(spec["attempt"])
        self.workdir = job_dir / "work"
        self.log_dir = job_dir / "logs"
        self.checkpoint_every = int(spec["checkpoint_every"])
        self.resume_step = spec.get("resume_step")
        self._resume_path = spec.get("resume_path")
        self._events = events
        # Ray across the allocation's nodes, for a trainer that asks (verl: a multi-node trial;
        # Miles: always, its train.py is a Ray driver).
        self.ray_cluster = raycluster.cluster
        for d in (self.workdir, self.log_dir, job_dir / "ckpt"):
            d.mkdir(parents=True, exist_ok=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._events.write("metrics", step=step, metrics=dict(metrics))

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        final = self.job_dir / "ckpt" / f"step-{step}"
        tmp = final.with_name(final.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        write(tmp)
        tmp.rename(final)
        self._events.write("checkpoint", step=step, path=str(final))

    def checkpoint_path(self, step: int) -> Path:
        if step == self.resume_step and self._resume_path:
            return Path(self._resume_path)
        return self.job_dir / "ckpt" / f"step-{step}"

    def should_stop(self) -> str | None:
        return "stopped by the orchestrator" if (self.job_dir / STOP).exists() else None

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        self._events.write("environment", facts=dict(facts))


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    spec = json.loads((job_dir / JOB).read_text())
    events = EventWriter(job_dir)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    events.write("start", job=os.environ.get("SLURM_JOB_ID"),
                 node=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                 restarts=restarts)
    if restarts:
        return 0  # see the module docstring: the orchestrator runs the retry
    module, cls = spec["trainer"]
    trainer = getattr(importlib.import_module(module), cls)()
    ctx = FileContext(job_dir, spec, events)
    try:
        result = trainer.run(ctx.trial, ctx.config, ctx)
    except BaseException as exc:
        kind = ("user" if isinstance(exc, UserError)
                else "checkpoint" if isinstance(exc, CheckpointError) else "infra")
        events.write("error", kind=kind, message=f"{type(exc).__name__}: {exc}")
        raise
    events.write("result", outcome=result.outcome.value, last_step=result.last_step,
                 reason=result.reason, summary=dict(result.summary))
    events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
