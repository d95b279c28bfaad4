"""``ablate probe GRID``: every configuration's training-inference mismatch before the grid
trains, each knob's share of it, and a pass/fail gate.

For each configuration of the grid that decides mismatch (its trainer's ``ProbeJob.identity``:
pool, engine and its flags, engine version, the trainer's precision and recompute, model), one
short job samples the grid's prompts with the rollout engine and recomputes their log-probs with
the trainer, no update, over a few batches and seeds (``_plan``, ``_run``); figures with
intervals (``_summary``) go to ``results/<grid>/probe.md|csv`` and plots (``_report``), and to
one MLflow run in the grid's experiment. A probe is content-hashed: a second one runs nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.grid import Gate, parse_gate
    from orchestrator.probe._plan import METRICS, Plan, plan
    from orchestrator.probe._probe import Preflight, ProbeReport, preflight, probe, probe_grid
    from orchestrator.probe._run import Measured
    from orchestrator.probe._summary import Summary

# Each name's module, imported on first use (PEP 562): a verl job imports ``verl_tokens`` in every
# process it starts (``probe/verl_job.py``), which must not import the grid's schema with it.
_LAZY = {"METRICS": "_plan", "Plan": "_plan", "plan": "_plan", "Measured": "_run",
         "Summary": "_summary", "Preflight": "_probe", "ProbeReport": "_probe",
         "preflight": "_probe", "probe": "_probe", "probe_grid": "_probe", "Gate": "_probe",
         "parse_gate": "_probe"}

__all__ = ["METRICS", "Gate", "Measured", "Plan", "Preflight", "ProbeReport", "Summary",
           "parse_gate", "plan", "preflight", "probe", "probe_grid"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator.probe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"orchestrator.probe.{module}"), name)
