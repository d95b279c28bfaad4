"""A verl trial's job as a launcher that runs it elsewhere sees it (``backends.base.TrainerJob``):
the Kubernetes launcher's RayJob and a Slurm allocation's size ask this, never verl's modules.

The argv and environment are :class:`~orchestrator.verl.trainer.VerlTrainer`'s own (the job a
RayJob runs is exactly the one a local attempt runs); metrics are verl's file logger, tailed and
normalised (``files.MetricTail``); checkpoints are verl's ``global_step_N`` directories, laid
out from the orchestrator's store to resume and handed back once their step's metrics are in
(``files.prepare_resume``, ``files.hand_over_checkpoint``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.backends.base import RunContext, TrainerJob
from orchestrator.backends.config import TrialConfig
from orchestrator.trial import TrialSpec
from orchestrator.verl.engine_choice import EngineChoice
from orchestrator.verl.files import MetricTail, hand_over_checkpoint, prepare_resume
from orchestrator.verl.topology import world_size


class VerlJob(TrainerJob):
    """One trial's ``python -m verl.trainer.main_ppo`` job on its configuration's pool."""

    # ``trainer``: ``VerlTrainer`` (untyped here: its module builds this one, no import circle).
    def __init__(self, trainer: Any, config: TrialConfig) -> None:
        self.trainer, self.config = trainer, config
        self.engine = EngineChoice.of(config.rollout, config.pool, config).engine
        self.world_size = world_size(config.pool, config)

    def describe(self, trial: TrialSpec) -> list[str]:
        """The job's exact Hydra override list."""
        return list(self.trainer.overrides(trial, self.config))

    def command(self, trial: TrialSpec, *, checkpoint_dir: str, resume_path: str | None = None,
                save_freq: int | None = None) -> list[str]:
        return self.trainer.command(trial, self.config, checkpoint_dir=checkpoint_dir,
                                    resume_path=resume_path, save_freq=save_freq)

    def environment(self, trial: TrialSpec, *, tracking_uri: str | None, run_id: str | None,
                    file_logger_path: str) -> dict[str, str | None]:
        return self.trainer.job_environment(trial, tracking_uri=tracking_uri, run_id=run_id,
                                            file_logger_path=file_logger_path)

    def metrics(self, path: Path, last_logged: int) -> Any:
        # A loss scaler's skipped updates are derived from verl's own metrics (files.normalise).
        return MetricTail(path, last_logged, self.config.learner.precision == "fp16")

    def resume_path(self, ctx: RunContext, checkpoint_dir: Path) -> str | None:
        return prepare_resume(ctx, checkpoint_dir)

    def hand_over(self, ctx: RunContext, checkpoint_dir: Path, saved: int, logged: int) -> int:
        return hand_over_checkpoint(ctx, checkpoint_dir, saved, logged)
