"""Durable state on disk: the one truth every process reads and writes.

Owns a trial's files (``records``: state.json, attempts.json, metrics.jsonl, cancel
requests), its checkpoint store (``CheckpointStore``), the grid lease that keeps a grid
single-run (``GridLease``) and where it all lives (``workspace``).
"""
from __future__ import annotations

from orchestrator.store import records, workspace
from orchestrator.store._checkpoints import MANIFEST, CheckpointStore, step_dir_name
from orchestrator.store._lease import GridLease, active_holder, process_gone

__all__ = ["MANIFEST", "CheckpointStore", "GridLease", "active_holder", "process_gone", "records",
           "step_dir_name", "workspace"]
