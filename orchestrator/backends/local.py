"""The local launcher: an attempt trains in the process that runs it (the Ray worker of its Tune
trial, or ``ablate run-trial``'s own process); a trainer with a job of its own (verl) supervises
it from there."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from orchestrator.backends.base import AttemptResult, Launcher, RunContext, Trainer
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec


class LocalLauncher(Launcher):
    """Runs the trainer here: this machine must have what the trainer needs."""

    name: ClassVar[str] = "local"

    @classmethod
    def require(cls, trainer: type[Trainer], pools: Iterable[PoolSpec], *,
                where: str = "") -> None:
        trainer.require(pools, where=where)

    def run(self, trainer: Trainer, trial: TrialSpec, config: Mapping[str, Any],
            ctx: RunContext) -> AttemptResult:
        return trainer.run(trial, config, ctx)
