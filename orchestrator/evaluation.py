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
  (``backends.base.Evaluator.problem``).
- ``engine`` (verl): a fixed evaluation configuration, the same for every arm: verl's own
  validation (its prompts, reward and core metric, as the trial's ``eval/reward``) of each
  saved checkpoint, run by one engine setting (``eval.rollout``, the rollout vocabulary) on one
  named pool (``eval.pool``) as a job of its own (``verl/reference_job.py``), by ``ablate
  evaluate`` after the trials (verl PR #7519's shared evaluation engine). Trial sections that
  do not enter validation (correction, learner) are those of the recipe for every arm.

The keys are part of a trial's identity when set (they become the trial overrides
``eval.reference``, ``eval.pool`` and ``eval.rollout``), and absent otherwise, so grids without
them keep their ids.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

REFERENCE_TARGETS = ("trainer", "engine")
# Targets the trial's runner scores as it goes (in its evals, or at each checkpoint it saves);
# the others are jobs of their own that ``ablate evaluate`` runs on the saved checkpoints.
IN_RUN_TARGETS = ("trainer",)
OVERRIDE_KEY = "eval.reference"  # the trial override the grid key becomes
POOL_KEY = "eval.pool"  # engine: the evaluation pool
ROLLOUT_KEY = "eval.rollout"  # engine: its engine settings (the rollout vocabulary)
GRID_KEYS = (OVERRIDE_KEY, POOL_KEY, ROLLOUT_KEY)  # set by the grid key ``eval:`` only


def reference_of(config: Mapping[str, Any]) -> str | None:
    """The reference target a resolved trial config asks for (None: no reference evaluation)."""
    section = config.get("eval") or {}
    value = section.get("reference") if isinstance(section, Mapping) else None
    return value if isinstance(value, str) else None


def reference_job(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(evaluation pool, engine settings) of a config whose reference is a job of its own."""
    section = config.get("eval") or {}
    if not isinstance(section, Mapping) or section.get("reference") in (None, *IN_RUN_TARGETS):
        return None
    return str(section.get("pool")), dict(section.get("rollout") or {})


def job_evaluator(version: str, pool: str, rollout: Mapping[str, Any]) -> str:
    """The name of a job's evaluator recorded with its scores (``store.reference``): another
    pool or engine setting is another evaluator, whose scores replace these."""
    return f"{version} pool={pool} rollout={json.dumps(dict(rollout), sort_keys=True)}"
