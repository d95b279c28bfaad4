"""MLflow tracking: an experiment per grid, a parent run per submission, a child run per trial.

Owns the runs (``GridRun``, ``TrialRun``), their durable outbox, the orchestrator-side sender
of deferred attempts (``Sender``), the UI (``ui``) and the clean-up of orphaned parent runs.
"""
from __future__ import annotations

from orchestrator.tracking._runs import (
    ROLE_TAG,
    GridRun,
    TrialRun,
    client,
    drain,
    is_remote,
    save_trials_view,
    supersede,
    ui,
    use_wal,
)
from orchestrator.tracking._sender import LIVE_AFTER_S, DeferredRun, Sender, buffer_dir, send_trial

__all__ = ["LIVE_AFTER_S", "ROLE_TAG", "DeferredRun", "GridRun", "Sender", "TrialRun", "buffer_dir",
           "client", "drain", "is_remote", "save_trials_view", "send_trial", "supersede", "ui",
           "use_wal"]
