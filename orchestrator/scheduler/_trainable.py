"""What a Ray Tune worker runs for one grid trial: ``_trainable`` turns the Tune trial's config
into an ``AttemptJob``, runs one attempt (``orchestrator.run``) and reports its state, verdict
and search objective to Tune.

Everything a submission's trials share travels once as a ``GridContext`` (through Ray's object
store, ``tune.with_parameters``); the per-trial config holds only the trial, its pool and where
its MLflow run lives. Ray pickles ``_trainable`` and ``GridContext`` by reference: the module
path is part of what a worker imports.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends import Backend, TrialConfig
from orchestrator.exceptions import Preempted
from orchestrator.pools import PoolSpec
from orchestrator.run import AttemptJob, run_attempt
from orchestrator.scheduler._search import objective_value
from orchestrator.schema import (
    CheckpointSpec,
    CollapseSpec,
    EarlyStopSpec,
    RescueEntry,
    SearchObjective,
)
from orchestrator.store.workspace import DISK_FULL
from orchestrator.tracking import TrackingTarget
from orchestrator.trial import TrialSpec


@dataclasses.dataclass(frozen=True)
class GridContext:
    """What every Tune trial of a submission shares (shipped once through the object store)."""

    grid_dir: str
    recipe_config: Mapping[str, Any]
    pools: Mapping[str, PoolSpec]
    checkpoint: CheckpointSpec
    collapse: CollapseSpec
    early_stop: EarlyStopSpec
    tracking_uri: str  # the experiment and parent run come with each trial's config (tracking.Sender)
    submission: str
    backend_refs: Mapping[str, Backend]
    objective: SearchObjective | None
    preemptions: int = 20  # retries.preemptions: retried here, apart from Tune's retries.max
    rescue: tuple[RescueEntry, ...] = ()  # the grid's rescue policy (a warning it acts on stops a trial)


_PASSED: set[str] = set()  # warm-up barriers this worker process has passed


def _warm_up(barrier: list[Any] | None, timeout: float = 20.0) -> None:
    """The first trial in a new worker waits (up to ``timeout``) until the fit's first workers
    have all started. Otherwise Tune gives the worker of a trial that just ended to a trial whose
    own worker is still starting, and kills that one; while trials are shorter than a worker's
    start-up (seconds, under load) this repeats forever and a slot stays empty."""
    if not barrier or barrier[0] in _PASSED:
        return
    directory, count = Path(barrier[0]), int(barrier[1])
    _PASSED.add(barrier[0])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout
    while sum(1 for _ in directory.iterdir()) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _attempts(job: AttemptJob, preemptions: int) -> dict[str, Any]:
    """Attempts of ``job`` until one ends without preemption: a preempted attempt (recorded
    as an infra failure) is followed by a new one from the last checkpoint, here rather than
    by Tune, so it does not count against ``retries.max``; past ``preemptions`` the last
    preemption goes to Tune like any infra failure."""
    for _ in range(preemptions):
        try:
            return run_attempt(job)
        except Preempted:
            continue
    return run_attempt(job)


def _trainable(config: dict[str, Any], gctx: GridContext) -> None:
    from ray import tune  # deferred: the driver imports this module for `ablate status` too

    _warm_up(config.get("warm_up"))
    trial = TrialSpec.from_json(config["trial"])
    job = AttemptJob(grid_dir=gctx.grid_dir, trial=trial,
                     config=TrialConfig.resolve(gctx.recipe_config, trial.override_map,
                                                gctx.pools[config["pool"]]),
                     checkpoint=gctx.checkpoint, collapse=gctx.collapse,
                     early_stop=gctx.early_stop, submission=gctx.submission,
                     tracking=TrackingTarget(gctx.tracking_uri, *(config.get("tracking") or ("", None))),
                     backend_ref=gctx.backend_refs[trial.backend], defer_tracking=True,
                     rescue=gctx.rescue)
    try:
        result = _attempts(job, gctx.preemptions)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        # Not for Tune to retry onto the same full disk: the submission stops (``_faults``).
        tune.report({"trial_id": trial.trial_id, "state": "pending", "fault": f"disk full: {exc}"})
        return
    report = {"trial_id": trial.trial_id, "state": result.get("state"),
              "last_step": result.get("last_step"), "node": result.get("node"),
              "verdict": (result.get("verdict") or {}).get("kind")}
    obj = objective_value(result, gctx.objective)
    if obj is not None:
        report["objective"] = obj
    tune.report(report)
