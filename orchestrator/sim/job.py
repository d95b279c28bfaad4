"""The simulator as a trainer: a real tiny GRPO loop with real training-inference mismatch.

Plan time (``check``) imports no torch. ``run`` validates the whole config before any work,
then trains, logging metrics every step and checkpointing every ``ctx.checkpoint_every`` steps.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator.backends.base import AttemptOutcome, AttemptResult, RunContext, Trainer
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import CheckpointError, NumericFailure, UserError
from orchestrator.learner import LearnerSpec, rollout_for
from orchestrator.pools import PoolSpec
from orchestrator.sim import numerics
from orchestrator.sim.config import build_setup, check_learner, reproducible
from orchestrator.sim.profile import check_rollout, parse_profile
from orchestrator.trial import TrialSpec


class SimTrainer(Trainer):
    """Runs trials on the CPU simulator (``orchestrator.sim``)."""

    name: ClassVar[str] = "sim"
    # sim-2: low-precision GEMMs computed explicitly and CPU numerics pinned (numbers changed).
    version: ClassVar[str] = "sim-2"
    pool_kinds: ClassVar[tuple[str, ...]] = ("sim",)

    @classmethod
    def check(cls, correction: CorrectionSpec, rollout: RolloutSpec, pool: PoolSpec) -> str | None:
        """Refuse what the simulator cannot honour. (routing_replay on a dense model is refused
        when the run starts: the model architecture is not known here.)"""
        if pool.kind != "sim":
            return f"pool {pool.name} is a {pool.kind} pool; the sim backend runs on sim-* pools"
        return check_rollout(rollout, pool.sim_profile, pool.name)

    @classmethod
    def check_pool(cls, pool: PoolSpec) -> tuple[str, str] | None:
        """A sim pool's ``sim_profile`` (knobs and values), checked where the catalogue has it."""
        if pool.kind != "sim":
            return None
        try:
            parse_profile(pool.sim_profile, pool.name)
        except UserError as exc:
            return "sim_profile", str(exc)
        return None

    @classmethod
    def check_learner(cls, learner: LearnerSpec, correction: CorrectionSpec,
                      rollout: RolloutSpec, pool: PoolSpec) -> str | None:
        """The simulator runs every loss, precision and the true on-policy bundle
        (``sim/config.check_learner``); the bundle's engine flags are checked on the pool."""
        rollout = rollout_for(learner, rollout)
        return check_learner(learner, correction, rollout) or check_rollout(
            rollout, pool.sim_profile, pool.name)

    @classmethod
    def check_values(cls, items: Iterable[tuple[str, Any]], config: Mapping[str, Any],
                     pool: PoolSpec) -> str | None:
        """Plan-time check of the recipe values a grid sets (model/task/train/eval): the same
        validation the trial runs first, so a bad value never becomes a failed trial."""
        try:
            build_setup(config, pool)
        except UserError as exc:
            return str(exc)
        return None

    @classmethod
    def check_reference(cls, target: str, pool: PoolSpec) -> str | None:
        """``trainer``: the fp32 trainer-side model with current weights (``sim/reference.py``)."""
        return None if target == "trainer" else f"eval.reference: {target} is not a target here"

    @classmethod
    def never_emitted(cls) -> frozenset[str]:
        """None of verl's debug metrics, its IcePop name or its per-option RS fractions."""
        return frozenset({M.IS_OOB_RATIO, M.PROB_DIFF_MAX, M.PROB_DIFF_STD, M.PROB_PEARSON}
                         | {n for opt in M.RS_OPTIONS for n in M.rs_option_names(opt)})

    @classmethod
    def worker_env(cls, config: Mapping[str, Any]) -> dict[str, str | None]:
        """Pinned CPU numerics for every simulator process (``orchestrator/sim/numerics.py``)."""
        return numerics.target_env(reproducible(config))

    reference_version: ClassVar[str | None] = "sim-ref-1"  # == sim.reference.VERSION (tested)

    def evaluate_checkpoint(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                            checkpoint: Path, step: int, target: str) -> float:
        """The fp32 trainer-side score of a saved checkpoint (``sim/reference.py``): its weights
        are the trainer's at ``step``, and the evaluator draws from (seed, step) only, so this is
        the number an ``eval: {reference: trainer}`` trial logs at that step."""
        setup = build_setup(config, pool)
        trainer = _trainer(trial, setup, reference=target)
        loaded = trainer.load(checkpoint)
        if loaded != step:
            raise CheckpointError(f"checkpoint for step {step} holds step {loaded}")
        return float(trainer.evaluate_reference(step))

    def run(self, trial: TrialSpec, config: Mapping[str, Any], ctx: RunContext) -> AttemptResult:
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


def _trainer(trial: TrialSpec, setup: Any, reference: str | None = None) -> Any:
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
    trainer = _trainer(trial, setup)
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
            bad = next((k for k, v in metrics.items() if not math.isfinite(v)), None)
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
