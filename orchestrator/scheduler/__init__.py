"""The control plane: runs a grid's trials on Ray Tune and steers them from any process.

Owns ``submit`` (expand, place on pools, run, judge, summarise), ``run_trials`` (exactly the
given trials), ``resume`` (finished trials continued from a checkpoint, possibly on another
pool; and the grid's automatic rescue), ``status_command``, ``cancel``, the grid's alerts
(``notify_test``), ``evaluate`` (saved checkpoints scored by the reference evaluator after the
fact) and the trial events a
submission reports off a terminal (``EventPrinter``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.scheduler._budget import Planner, Seen, end_report
    from orchestrator.scheduler._control import cancel, status_command
    from orchestrator.scheduler._evaluate import EvaluateReport, evaluate
    from orchestrator.scheduler._events import EventPrinter, EventWatcher, PoolCounts, TrialEvent
    from orchestrator.scheduler._identity import as_submitted, renamed, stored_stores
    from orchestrator.scheduler._notify import notify_test
    from orchestrator.scheduler._reports import Resumed, ResumeReport, SubmitReport
    from orchestrator.scheduler._resume import resume
    from orchestrator.scheduler._submission import run_trials, submit

# Each name from its module on first use (PEP 562): ``ablate status`` reads records and imports
# neither Ray, the grid schema nor the submission machinery.
_WHERE = {
    "Planner": "_budget", "Seen": "_budget", "end_report": "_budget", "cancel": "_control",
    "status_command": "_control",
    "EvaluateReport": "_evaluate", "evaluate": "_evaluate", "EventPrinter": "_events",
    "EventWatcher": "_events", "PoolCounts": "_events", "TrialEvent": "_events",
    "as_submitted": "_identity", "renamed": "_identity", "stored_stores": "_identity",
    "notify_test": "_notify", "ResumeReport": "_reports", "Resumed": "_reports",
    "SubmitReport": "_reports", "resume": "_resume", "run_trials": "_submission", "submit": "_submission",
}
__all__ = ["EvaluateReport", "EventPrinter", "EventWatcher", "Planner", "PoolCounts",
           "ResumeReport", "Resumed", "Seen", "SubmitReport", "TrialEvent", "as_submitted", "cancel", "end_report", "evaluate", "notify_test",
           "renamed", "resume", "run_trials", "status_command", "stored_stores", "submit"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
