"""Durable state on disk: the one truth every process reads and writes.

Owns a trial's files (``TrialPaths``; ``records``: state.json, attempts.json, metrics.jsonl,
cancel requests), the atomic JSON writes and checked reads every state file goes through
(``atomic_write_json``, ``read_json``), its checkpoint store (``CheckpointStore``), the grid
lease that keeps a grid single-run (``GridLease``) and where it all lives (``workspace``).
"""
from __future__ import annotations

from orchestrator.store import probe_ledger, records, summary_table, workspace
from orchestrator.store._checkpoints import MANIFEST, CheckpointStore, link_tree, step_dir_name
from orchestrator.store._files import (
    TrialPaths,
    atomic_write_json,
    atomic_write_text,
    corrupt_state_file,
    read_json,
)
from orchestrator.store._lease import GridLease, active_holder, process_gone
from orchestrator.store.records import ResumeRequest, TrialRecord

__all__ = ["MANIFEST", "CheckpointStore", "GridLease", "ResumeRequest", "TrialPaths", "TrialRecord",
           "active_holder", "atomic_write_json", "atomic_write_text", "corrupt_state_file",
           "link_tree", "probe_ledger", "process_gone", "read_json",
           "records", "step_dir_name", "summary_table", "workspace"]
