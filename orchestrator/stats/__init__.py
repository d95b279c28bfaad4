"""The statistics every report and decision uses, one module per question, one place for the
formulas: ``intervals`` (Wilson, Newcombe, Student t, bounded t, Welch, paired t), ``survival``
(time to collapse: Kaplan-Meier and log-rank from scipy, median, RMST), ``hypotheses``
(p-values of intervals, Holm/BH, TOST equivalence), ``sequential`` (Lan-DeMets O'Brien-Fleming
boundaries, used by the interim-look study ``benchmarks/adaptive_seeds_interim.py``) and
``seeds`` (the adaptive-seed and declared-comparison rules the scheduler and ``compare`` share).

Pure functions over numbers and the grid's vocabulary (``orchestrator.schema``): nothing here
reads MLflow, the workdir or Ray, so the scheduler, ``compare`` and the benchmarks call the same
code.
"""
