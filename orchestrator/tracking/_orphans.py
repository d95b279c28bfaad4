"""MLflow parent runs left ``RUNNING`` by an orchestrator that died (SIGKILL, OOM, power loss).

A submission's parent run is ended by the process that opened it; a killed process cannot, so
the run would show as running forever in the MLflow UI. Every parent run records the host and
pid of its process (``ablate.host``, ``ablate.pid``, with the run's start time); when a new
parent run of the same grid is opened, the ones whose process is gone on this host are ended as
``KILLED`` and tagged with the run that noticed. Runs of live processes (a concurrent
``ablate run-trial``) and of other hosts are left alone: only their own host can tell.

A trial's child run is named on disk by its record (``state.json``), by its outbox
(``run.json``), or, while it is being created, by the outbox's creation token, written before
the run exists and tagged on it (``_runs.TrialRun._create`` adopts such a run). A ``RUNNING``
trial run that none of these name was left by a process that died in a window older code had
(or by an outbox replaced since): it is ended ``KILLED``, tagged, and soft-deleted, so the
trial has one live run and ``ablate compare`` reads the one its record names.
"""
from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from orchestrator.store import TrialPaths, process_gone, read_json, records
from orchestrator.tracking._labels import CREATION_TAG
from orchestrator.tracking._store import ROLE_TAG

log = logging.getLogger(__name__)
HOST_TAG, PID_TAG = "ablate.host", "ablate.pid"


def process_tags() -> dict[str, str]:
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def close_orphaned_parents(mlc: Any, experiment_id: str, keep: str) -> list[str]:
    """End this host's dead parent runs of the experiment; returns their run ids."""
    closed = []
    runs = mlc.search_runs([experiment_id], filter_string="tags.`ablate.role` = 'grid' and "
                           "attributes.status = 'RUNNING'", max_results=1000)
    for run in runs:
        tags = run.data.tags
        if run.info.run_id == keep or tags.get(HOST_TAG) != socket.gethostname():
            continue
        try:
            pid = int(tags.get(PID_TAG, ""))
        except ValueError:
            continue
        if process_gone(pid, (run.info.start_time or 0) / 1000):
            mlc.set_tag(run.info.run_id, "ablate.ended", f"orchestrator pid {pid} died; "
                        f"ended by the submission of run {keep}")
            mlc.set_terminated(run.info.run_id, "KILLED")
            closed.append(run.info.run_id)
    if closed:
        log.info("ended %d parent run(s) of dead orchestrators: %s", len(closed), ", ".join(closed))
    return closed


def retire_orphaned_trial_runs(mlc: Any, experiment_id: str, grid_dir: Path, keep: str) -> list[str]:
    """End and soft-delete the grid's ``RUNNING`` trial runs that nothing on disk names (the
    module docstring says which do); returns their run ids. A trial without a folder here (a
    workdir elsewhere) is left alone: only its own records can tell."""
    retired = []
    token = None
    while True:
        page = mlc.search_runs([experiment_id], max_results=1000, page_token=token,
                               filter_string=f"tags.`{ROLE_TAG}` = 'trial' and "
                               "attributes.status = 'RUNNING'")
        for run in page:
            tid = run.data.tags.get("trial_id", "")
            if tid and _unnamed(TrialPaths(grid_dir, tid), tid, run):
                mlc.set_tag(run.info.run_id, "ablate.ended",
                            f"no record of trial {tid} names this run (its process died before "
                            f"recording it); retired by the submission of run {keep}")
                mlc.set_terminated(run.info.run_id, "KILLED")
                mlc.delete_run(run.info.run_id)
                retired.append(run.info.run_id)
        token = page.token
        if not token:
            break
    if retired:
        log.info("retired %d trial run(s) that no trial record names: %s", len(retired),
                 ", ".join(retired))
    return retired


def _unnamed(paths: TrialPaths, trial_id: str, run: Any) -> bool:
    if not paths.root.is_dir():
        return False
    try:
        rec = records.load_state(paths, trial_id)
        box = read_json(paths.outbox / "run.json") if (paths.outbox / "run.json").exists() else {}
    except Exception:  # noqa: BLE001 - a damaged record is repaired by the submission, not here
        return False
    named = {rec.mlflow_run_id, *rec.superseded_runs, box.get("run_id")}
    token = box.get("creation_token")
    return run.info.run_id not in named and not (token and run.data.tags.get(CREATION_TAG) == token)
