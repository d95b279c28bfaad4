"""The grid language: a grid file in, content-hashed trials out.

Owns the pipeline safe YAML (``orchestrator.safeyaml``) -> pydantic schema -> recipe compose
-> semantic checks (``_validation``) -> frozen ``GridSpec`` (``_load``) -> ``expand``
(``_expansion``).
Every user mistake is a one-line ``GridError``; nothing here starts a run or writes a file.
"""
from __future__ import annotations

from orchestrator.grid._adaptive import plan_lines
from orchestrator.grid._expansion import derive_trial, expand, search_trial
from orchestrator.grid._load import load_grid
from orchestrator.grid._notify import check_notify, redact_url, webhook_url
from orchestrator.grid._policy import (
    BUDGET_REFUSAL,
    EARLY_WARNING,
    entry_for,
    entry_paths,
    fixed_on_resume,
    lineage,
    notes,
    warning_stops,
)
from orchestrator.grid._preflight import Gate, parse_gate, preflight_gates
from orchestrator.grid._spec import SECTIONS, Axis, GridSpec, axis_label
from orchestrator.safeyaml import load_yaml

__all__ = ["BUDGET_REFUSAL", "EARLY_WARNING", "SECTIONS", "Axis", "Gate", "GridSpec",
           "axis_label", "check_notify", "derive_trial", "entry_for", "entry_paths", "expand",
           "fixed_on_resume", "lineage", "load_grid", "load_yaml", "notes", "parse_gate",
           "plan_lines", "preflight_gates", "redact_url", "search_trial", "warning_stops",
           "webhook_url"]
