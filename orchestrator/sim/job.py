"""The simulator as a trainer: a real tiny GRPO loop with real training-inference mismatch.

Plan time (``problems``) imports no torch. ``run`` validates the whole config before any work,
then trains, logging metrics every step and checkpointing every ``ctx.checkpoint_every`` steps.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator.backends.base import (
    PLAN,
    AttemptOutcome,
    AttemptResult,
    Emits,
    Problem,
    RunContext,
    Trainer,
    problem,
)
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import CheckpointError, NumericFailure, UserError
from orchestrator.learner import rollout_for
from orchestrator.pools import PoolSpec
from orchestrator.sim import numerics
from orchestrator.sim.config import build_setup, check_learner, reproducible
from orchestrator.sim.profile import check_rollout, parse_profile
from orchestrator.trial import TrialSpec
from orchestrator.verdict import excused


class SimTrainer(Trainer):
    """Runs trials on the CPU simulator (``orchestrator.sim``)."""

    name: ClassVar[str] = "sim"
    # sim-2: low-precision GEMMs computed explicitly and CPU numerics pinned (numbers changed).
    version: ClassVar[str] = "sim-2"
    pool_kinds: ClassVar[tuple[str, ...]] = ("sim",)

    @classmethod
    def problems(cls, config: TrialConfig, *, stages: frozenset[str] = PLAN,
                 given: Iterable[tuple[str, Any]] = (), checkpoint: Path | None = None,
                 others: Iterable[PoolSpec] = ()) -> list[Problem]:
        """What the simulator cannot honour: a pool's ``sim_profile`` (knobs and values, where
        the catalogue has it); the pool's kind and the engine flags its profile models; every
        loss, precision and the true on-policy bundle run (``sim/config.check_learner``), the
        bundle's engine flags checked on the pool; and the recipe's values, by the same
        validation the trial runs first, so a bad value never becomes a failed trial.
        (routing_replay on a dense model is refused when the run starts: the model architecture
        is not known here.) A checkpoint holds the whole state: it resumes on any sim pool."""
        pool, found = config.pool, []
        if "pool" in stages and pool.kind == "sim":
            try:
                parse_profile(pool.sim_profile, pool.name)
            except UserError as exc:
                found.append(Problem("pool", str(exc), "sim_profile"))
        if "combination" in stages:
            if pool.kind != "sim":
                return found + problem("combination", f"pool {pool.name} is a {pool.kind} pool; "
                                       "the sim backend runs on sim-* pools")
            rollout = rollout_for(config.learner, config.rollout)
            found += problem("combination", check_rollout(config.rollout, pool.sim_profile,
                                                          pool.name)
                             or check_learner(config.learner, config.correction, rollout)
                             or check_rollout(rollout, pool.sim_profile, pool.name))
        if "values" in stages:
            try:
                build_setup(config, pool)
            except UserError as exc:
                found.append(Problem("values", str(exc)))
        return found

    @classmethod
    def emits(cls, config: TrialConfig | None = None) -> Emits:
        """None of verl's debug metrics, its IcePop name or its per-option RS fractions."""
        return dataclasses.replace(super().emits(config), never=frozenset(
            {M.IS_OOB_RATIO, M.PROB_DIFF_MAX, M.PROB_DIFF_STD, M.PROB_PEARSON}
            | {n for opt in M.RS_OPTIONS for n in M.rs_option_names(opt)}))

    @classmethod
    def environment(cls, config: Mapping[str, Any]) -> dict[str, str | None]:
        """Pinned CPU numerics for every simulator process (``orchestrator/sim/numerics.py``)."""
        return numerics.target_env(reproducible(config))

    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        setup = build_setup(config, ctx.pool)  # raises UserError before any work
        return _train(trial, setup, ctx)


def numeric_environment(reproducible: bool) -> dict[str, str]:
    """The ``numerics.*`` facts of this process (torch imported), for the attempt record and
    MLflow tags; a run that asked for pinned numerics and did not get them says why in a log
    line too."""
    env = numerics.describe(reproducible)
    if reproducible and not env["reproducible"]:
        logging.getLogger(__name__).warning("numerics not pinned: %s", env["why"])
    facts = {f"numerics.{k}": str(v).lower() if isinstance(v, bool) else str(v)
             for k, v in env.items()}
    facts["numerics.fingerprint"] = numerics.fingerprint(env)
    return facts


def trial_trainer(trial: TrialSpec, setup: Any, reference: str | None = None) -> Any:
    """The trial's ``GRPOTrainer`` (``reference``: also set up the reference evaluator)."""
    # deferred: torch, and the simulator modules that import it, only where a trial trains
    import torch

    from orchestrator.sim.model import ModelConfig
    from orchestrator.sim.task import Task
    from orchestrator.sim.trainer import GRPOTrainer, TrainConfig

    torch.set_num_threads(setup.threads)
    try:
        task = Task(**setup.task)
    except (TypeError, ValueError) as exc:
        raise UserError(f"task: {exc}") from None
    model = ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model)
    train = {**setup.train, **({"eval_reference": reference} if reference else {})}
    return GRPOTrainer(model, task, TrainConfig(**train), setup.correction, setup.numerics,
                       trial.seed, setup.learner)


def _train(trial: TrialSpec, setup: Any, ctx: RunContext) -> AttemptResult:
    import torch  # deferred: only where a trial trains

    torch.set_num_threads(setup.threads)  # before the facts: they record the thread count
    ctx.describe_environment(numeric_environment(setup.reproducible))
    trainer = trial_trainer(trial, setup)
    last = 0
    if ctx.resume_step:
        last = trainer.load(ctx.checkpoint_path(ctx.resume_step))
        if last != ctx.resume_step:
            raise CheckpointError(f"checkpoint for step {ctx.resume_step} holds step {last}")
    summary: dict[str, float] = {}
    for step in range(last + 1, trial.steps + 1):
        reason = ctx.should_stop()
        if reason:
            return AttemptResult(AttemptOutcome.STOPPED, last, reason, summary)
        try:
            metrics = trainer.step(step)
            bad = next((k for k, v in metrics.items()
                        if not math.isfinite(v) and not excused(k, metrics)), None)
            if bad:
                raise NumericFailure(f"non-finite metric {bad} at step {step}")
        except NumericFailure as exc:
            return AttemptResult(AttemptOutcome.NUMERIC_FAILURE, last, str(exc), summary)
        ctx.log_metrics(step, metrics)
        last = step
        summary = {k: metrics[k] for k in (M.TRAIN_REWARD, M.K3_KL, M.GRAD_NORM) if k in metrics}
        for key in (M.EVAL_REWARD, M.EVAL_REWARD_REF):
            if key in metrics:
                summary[key] = metrics[key]
        if ctx.checkpoint_every and step % ctx.checkpoint_every == 0:
            if not all(torch.isfinite(p).all() for p in trainer.params.values()):
                return AttemptResult(AttemptOutcome.NUMERIC_FAILURE, last,
                                     f"non-finite weights after step {step}", summary)
            ctx.save_checkpoint(step, lambda d, s=step: trainer.save(d, s))
    return AttemptResult(AttemptOutcome.COMPLETED, last, None, summary)
