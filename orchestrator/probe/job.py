"""One probe job (``python -m orchestrator.probe.job JOB_DIR``, or ``run`` in this process): a
configuration's probe, or its knobs' probes, by its trainer's ``ProbeJob``.

``task.json`` in ``JOB_DIR`` holds all it needs as data (the probe job's class, the trial, its
configuration read back into a ``TrialConfig`` here, seeds, batches, the knobs); it leaves
``result.json`` (the rows, the engine's settings, its own wall time) or, run as a module,
``error.json`` (``backends.short``). The grid's launcher runs it where the pool's trials run.
"""
from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from orchestrator.backends.config import TrialConfig
from orchestrator.backends.short import RESULT, write_error
from orchestrator.exceptions import UserError
from orchestrator.store import atomic_write_json, read_json
from orchestrator.trial import TrialSpec

TASK = "task.json"


def task(job: type, trial: TrialSpec, config: TrialConfig, seeds: list[int], batches: int,
         knobs: list[str] | None = None) -> dict[str, Any]:
    """The job's ``task.json``: a configuration's probe, or (``knobs``) its knobs' probes."""
    return {"job": [job.__module__, job.__qualname__], "trial": trial.to_json(),
            "config": config.to_json(), "seeds": seeds, "batches": batches, "knobs": knobs}


def run(job_dir: Path) -> None:
    spec = read_json(job_dir / TASK)
    module, name = spec["job"]
    job = getattr(importlib.import_module(module), name)()
    trial = TrialSpec.from_json(spec["trial"])
    config = TrialConfig.from_json(spec["config"])  # read back into the one type
    why = job.check(config, config.pool)  # where the job runs: this node must run it
    if why:
        raise UserError(f"the probe of trial {trial.trial_id} cannot run on "
                        f"{config.pool.name} here: {why}")
    seeds, batches = [int(s) for s in spec["seeds"]], int(spec["batches"])
    t0, started = time.perf_counter(), time.time()
    if spec.get("knobs"):
        out: dict[str, Any] = {"knobs": job.run_knobs(trial, config, config.pool, seeds,
                                                      batches, list(spec["knobs"]))}
    else:
        rows, engine = job.run(trial, config, config.pool, seeds, batches)
        out = {"rows": rows, "engine": engine}
    out["seconds"] = time.perf_counter() - t0
    # Where it ran (a Slurm job's node, job and partition), kept in the probe's record.
    out["ran_on"] = {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                     "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                     "partition": os.environ.get("SLURM_JOB_PARTITION"),
                     "started": started, "ended": time.time()}
    atomic_write_json(job_dir / RESULT, out)


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    try:
        run(job_dir)
    except BaseException as exc:  # noqa: BLE001 - every failure is left for the orchestrator
        write_error(job_dir, exc)
        if isinstance(exc, UserError):
            print(f"error: {exc}", file=sys.stderr)
        else:  # the job's log is where its traceback goes
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
