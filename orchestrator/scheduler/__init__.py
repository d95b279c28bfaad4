"""The control plane: runs a grid's trials on Ray Tune and steers them from any process.

Owns ``submit`` (expand, place on pools, run, judge, summarise), ``run_trials`` (exactly the
given trials), ``resume`` (finished trials continued from a checkpoint, possibly on another
pool; and the grid's automatic rescue), ``status_command``, ``cancel``, the grid's alerts (``notify_test``) and the trial events a
submission reports off a terminal (``EventPrinter``).
"""
from __future__ import annotations

from orchestrator.scheduler._budget import end_report
from orchestrator.scheduler._control import cancel, status_command
from orchestrator.scheduler._events import EventPrinter, EventWatcher, PoolCounts, TrialEvent
from orchestrator.scheduler._identity import renamed, stored_stores
from orchestrator.scheduler._notify import notify_test
from orchestrator.scheduler._resume import resume
from orchestrator.scheduler._submission import run_trials, submit

__all__ = ["EventPrinter", "EventWatcher", "PoolCounts", "TrialEvent", "cancel", "end_report",
           "notify_test", "renamed", "resume", "run_trials", "status_command", "stored_stores",
           "submit"]
