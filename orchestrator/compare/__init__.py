"""``ablate compare``: comparison tables, statistics and plots of a grid's tracked trials.

Owns reading the trial runs back from MLflow (``load_results``), the pivot by two axes with
seeds aggregated (``_stats``), the plots (``_plots``) and ``results/<grid>/`` (``compare``).
"""
from __future__ import annotations

from orchestrator.compare._data import TrialResult, load_results, newest_per_step
from orchestrator.compare._report import build_report, compare, pick_axes

__all__ = ["TrialResult", "build_report", "compare", "load_results", "newest_per_step", "pick_axes"]
