"""Reference evaluation: one evaluator scores every arm's policy, beside the arm's own eval.

A trial's ``eval/reward`` is sampled by its own rollout engine (its pool's numerics, its engine
flags, on some pools weights a few syncs stale), so when arms differ in pool, engine or
precision its final reward mixes how well the policy trained with how well that arm's engine
samples it. A grid's ``eval: {reference: <target>}`` also scores each eval step with one
evaluator that is the same for every arm, recorded as ``eval/reward_ref``
(``metrics.EVAL_REWARD_REF``), so the two can be told apart (issue 41; verl PR #7519 evaluates
every arm with one shared engine for this reason).

Targets:

- ``trainer``: the trainer-side model in fp32 with the trainer's current weights (no lag, no
  engine rounding), sampling the same held-out prompts with noise drawn from (seed, step) only,
  so two arms with one seed are scored on the same prompts with the same uniforms. On the
  simulator ``sim/reference.py``; a trainer that cannot run it refuses the grid at plan
  (``backends.base.Trainer.check_reference``).

The key is part of a trial's identity when set (it becomes the trial override
``eval.reference``), and absent otherwise, so grids without it keep their ids.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REFERENCE_TARGETS = ("trainer",)
OVERRIDE_KEY = "eval.reference"  # the trial override the grid key becomes


def reference_of(config: Mapping[str, Any]) -> str | None:
    """The reference target a resolved trial config asks for (None: no reference evaluation)."""
    section = config.get("eval") or {}
    value = section.get("reference") if isinstance(section, Mapping) else None
    return value if isinstance(value, str) else None
