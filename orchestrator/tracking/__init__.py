"""MLflow tracking: an experiment per grid, a parent run per submission, a child run per trial.

Owns the runs (``GridRun``, ``TrialRun``) and their durable outbox, deferred tracking of short
attempts (``DeferredRun``) and its orchestrator-side ``Sender``, the store plumbing (``client``,
timeouts, WAL), the grid's UI view and ``ablate ui``, the clean-up of orphaned parent runs, the grid's summary table as a
parent-run artifact, and ``ablate publish`` (a grid's recorded trials copied into another store).
"""
from __future__ import annotations

from orchestrator.tracking._deferred import DeferredRun
from orchestrator.tracking._grid_run import GridRun, TrackingTarget, experiment_for, parent_run
from orchestrator.tracking._publish import PublishReport, publish, recorded_elsewhere
from orchestrator.tracking._runs import TrialRun, drain, outbox_run_id, supersede
from orchestrator.tracking._sender import Sender, send_trial
from orchestrator.tracking._store import (
    AXES_TAG,
    CONFIG_TAG,
    ROLE_TAG,
    check_store,
    client,
    fail_fast,
    is_remote,
    log_steps,
    sanitize_key,
    store_exists,
    use_wal,
)
from orchestrator.tracking._summaries import publish_summaries, published_summaries
from orchestrator.tracking._ui import server_command, server_env, stop_group, ui
from orchestrator.tracking._views import save_trials_view

__all__ = [
    "AXES_TAG",
    "CONFIG_TAG",
    "ROLE_TAG",
    "DeferredRun",
    "GridRun",
    "PublishReport",
    "Sender",
    "TrackingTarget",
    "TrialRun",
    "check_store",
    "client",
    "drain",
    "experiment_for",
    "fail_fast",
    "is_remote",
    "log_steps",
    "outbox_run_id",
    "parent_run",
    "publish",
    "publish_summaries",
    "published_summaries",
    "recorded_elsewhere",
    "sanitize_key",
    "save_trials_view",
    "send_trial",
    "server_command",
    "server_env",
    "stop_group",
    "store_exists",
    "supersede",
    "ui",
    "use_wal",
]
