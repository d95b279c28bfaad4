"""The simulator's reference evaluator as the trainer contract registers it
(``backends._EVALUATORS``): ``eval: {reference: trainer}`` scored in the trial's own process
(``sim/reference.py``), and the same score of a saved checkpoint after the fact. Plan time
imports no torch."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.base import Evaluator
from orchestrator.exceptions import CheckpointError
from orchestrator.pools import PoolSpec
from orchestrator.sim.config import build_setup
from orchestrator.sim.job import trial_trainer
from orchestrator.trial import TrialSpec


class SimEvaluator(Evaluator):
    """``trainer``: the fp32 trainer-side model with current weights (``sim/reference.py``)."""

    version: ClassVar[str | None] = "sim-ref-1"  # == sim.reference.VERSION (tested)

    def problem(self, target: str, pool: PoolSpec) -> str | None:
        return None if target == "trainer" else f"eval.reference: {target} is not a target here"

    def score(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
              checkpoint: Path, step: int, target: str) -> float:
        """The fp32 trainer-side score of a saved checkpoint: its weights are the trainer's at
        ``step``, and the evaluator draws from (seed, step) only, so this is the number an
        ``eval: {reference: trainer}`` trial logs at that step."""
        trainer = trial_trainer(trial, build_setup(config, pool), reference=target)
        loaded = trainer.load(checkpoint)
        if loaded != step:
            raise CheckpointError(f"checkpoint for step {step} holds step {loaded}")
        return float(trainer.evaluate_reference(step))
