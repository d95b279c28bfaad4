"""One attempt of one trial, in a Ray worker or in this process.

Owns what happens above the backend during an attempt: the trial's lock, its files, the
checkpoint store, the verdict engine and the MLflow commits (``run_attempt``), and running a
single trial without Ray (``run_single``, ``ablate run-trial``).
"""
from __future__ import annotations

from orchestrator.run._runner import make_job, run_attempt, run_single
from orchestrator.run._state import AttemptJob

__all__ = ["AttemptJob", "make_job", "run_attempt", "run_single"]
