"""MLflow parent runs left ``RUNNING`` by an orchestrator that died (SIGKILL, OOM, power loss).

A submission's parent run is ended by the process that opened it; a killed process cannot, so
the run would show as running forever in the MLflow UI. Every parent run records the host and
pid of its process (``ablate.host``, ``ablate.pid``, with the run's start time); when a new
parent run of the same grid is opened, the ones whose process is gone on this host are ended as
``KILLED`` and tagged with the run that noticed. Runs of live processes (a concurrent
``ablate run-trial``) and of other hosts are left alone: only their own host can tell.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any

from orchestrator.store import process_gone

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
