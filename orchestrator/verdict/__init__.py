"""Verdicts on a trial's metric stream: healthy, collapsed, unstable, numeric or infra failure.

Rules come from the grid's ``collapse:`` section (defaults drawn from the seeds, ``_rules``): a
grad-norm explosion against its running median, a reward drop from its peak, a PPL blow-up, k3
KL above a threshold for many steps, zero gradients (a dead policy), non-finite metrics. A rule
*fires* once its condition has held for ``patience`` consecutive observations; the verdict's step
is the first of those (``_detectors`` follows one rule over the stream).

A fired collapse rule that the trial later recovers from (back past the recovery threshold,
against the reference frozen when it fired, for the last observations of a completed run) makes
the trial ``unstable``, not ``collapsed``: only hindsight knows that, which is why early stop
waits until the rule has held for ``margin`` consecutive observations, and why
``benchmarks/early_stop.py`` measures wrongly stopped trials. The recovery threshold sits halfway
between "no change" and the firing threshold (``HYSTERESIS``): a reward that fell 50% from its
peak has not recovered at 45% down.

The value (``Verdict``, ``VerdictKind``, ``_value``) is what tracking, the records and
``compare`` read; the engine (``VerdictEngine``, ``judge``, ``_engine``) is what ``run/`` feeds
step by step and what ``compare`` and the benchmarks replay a stored history through. The engine
is here rather than in ``run/`` because it is a pure function of the metric stream, with no
tie to an attempt.
"""
from __future__ import annotations

from orchestrator.verdict._detectors import excused
from orchestrator.verdict._engine import OUTCOMES, VerdictEngine, judge
from orchestrator.verdict._rules import DEFAULT_RULES, resolve_rules
from orchestrator.verdict._value import Verdict, VerdictKind

__all__ = ["DEFAULT_RULES", "OUTCOMES", "Verdict", "VerdictEngine", "VerdictKind", "excused",
           "judge", "resolve_rules"]
