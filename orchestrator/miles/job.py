"""A Miles trial's job as every launcher sees it (``backends.base.TrainerJob``): its command,
environment, world size, metric reader and checkpoint layout.

* command: ``python3 -m orchestrator.miles.entry --checkout DIR --mis JSON -- ARGS``: the entry
  point writes the trial's ``mis.yaml`` where the job runs, changes to the Miles checkout and
  executes ``train.py ARGS`` (Miles' examples import from the checkout's root, as Miles' own
  scripts run them), so a Ray job, a RayJob and a Slurm step run the same argument list;
* metrics: Miles' TensorBoard event files (``events.TensorBoardTail``);
* checkpoints: Megatron's ``iter_NNNNNNN`` directories and ``latest_checkpointed_iteration.txt``
  (megatron/training/checkpointing.py:162-171, 281) in ``--save``: rollout ``r``'s checkpoint
  is the state after the trial's step ``r + 1``; a resume lays the stored checkpoint of step
  ``s`` out as iteration ``s - 1`` and passes the folder as ``--load`` (Miles then starts at
  rollout ``s``, megatron_utils/actor.py:134).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.base import RunContext, TrainerJob
from orchestrator.backends.config import TrialConfig
from orchestrator.miles import events, flags
from orchestrator.store import link_tree
from orchestrator.trial import TrialSpec

TRACKER = "latest_checkpointed_iteration.txt"
MIS_PLACEHOLDER = "@MIS_YAML@"  # the entry point puts the written mis.yaml's path here


def iteration_dir(iteration: int) -> str:
    return f"iter_{iteration:07d}"


class MilesJob(TrainerJob):
    """One trial's Miles run on its configuration's pool."""

    # The pool's image for this job (``images: {miles: ...}``) and how the launchers name it.
    engine: ClassVar[str] = "miles"

    # ``trainer``: ``MilesTrainer`` (untyped here: its module builds this one, no import circle).
    def __init__(self, trainer: Any, config: TrialConfig) -> None:
        self.trainer, self.config = trainer, config
        self.world_size = config.pool.world_size
        self.checkout = str(config.pool.miles.get("checkout") or ".")

    def describe(self, trial: TrialSpec) -> list[str]:
        """train.py's arguments, one flag (with its values) a line, then the trial's mis.yaml
        keys and the job's environment."""
        argv, mis, env = self.trainer.arguments(trial, self.config)
        lines: list[str] = []
        for arg in argv:
            if arg.startswith("--") or not lines:
                lines.append(arg)
            else:
                lines[-1] += " " + arg
        lines += [f"mis.yaml {k}: {json.dumps(v)}" for k, v in (mis or {}).items()]
        return lines + [f"env {k}={v}" for k, v in sorted(env.items())]

    def command(self, trial: TrialSpec, *, checkpoint_dir: str, resume_path: str | None = None,
                save_freq: int | None = None) -> list[str]:
        argv, mis, _ = self.trainer.arguments(trial, self.config, checkpoint_dir=checkpoint_dir,
                                              resume_path=resume_path, save_freq=save_freq,
                                              mis_path=MIS_PLACEHOLDER)
        return ["python3", "-m", "orchestrator.miles.entry", "--checkout", self.checkout,
                "--mis", json.dumps(mis), "--", *argv]

    def environment(self, trial: TrialSpec, *, tracking_uri: str | None, run_id: str | None,
                    file_logger_path: str) -> dict[str, str | None]:
        """The job's environment: Miles' own (``flags``), where TensorBoard writes
        (``file_logger_path``: this attempt's metrics directory) and the trial's id. Miles'
        MLflow logger stays off: the runner is the trial run's one writer."""
        _, env = flags.learner_flags(self.config.learner)
        return {**env, "TENSORBOARD_DIR": file_logger_path, "ABLATE_TRIAL_ID": trial.trial_id}

    def metrics(self, path: Path, last_logged: int) -> events.TensorBoardTail:
        section = self.config[self.trainer.SECTION]
        eval_data = section.get("eval_prompt_data")
        eval_tag = eval_data[0] if isinstance(eval_data, list) and eval_data else None
        return events.TensorBoardTail(
            path, last_logged, steps_per_rollout=events.steps_per_rollout(section),
            eval_tag=eval_tag, mis=self.trainer.runs_mis(self.config))

    def resume_path(self, ctx: RunContext, checkpoint_dir: Path) -> str | None:
        if ctx.resume_step is None:
            return None
        iteration = ctx.resume_step - 1
        target = checkpoint_dir / iteration_dir(iteration)
        if target.exists():
            shutil.rmtree(target)
        link_tree(ctx.checkpoint_path(ctx.resume_step), target)
        (checkpoint_dir / TRACKER).write_text(str(iteration))
        return str(checkpoint_dir)

    def hand_over(self, ctx: RunContext, checkpoint_dir: Path, saved: int, logged: int) -> int:
        """Give each finished Miles checkpoint to the store, oldest first, once its step's
        metrics are in: every iteration up to the tracker file's (Megatron writes the tracker
        after the iteration's directory is complete). Not only the newest: a job that runs
        ahead of its metrics (TensorBoard flushes late) has moved the tracker past a step this
        loop had not logged yet, and a rescue from that step needs its checkpoint."""
        try:
            tracked = int((checkpoint_dir / TRACKER).read_text().strip()) + 1
        except (OSError, ValueError):
            return saved
        done = sorted(int(p.name[len("iter_"):]) + 1 for p in checkpoint_dir.glob("iter_*")
                      if p.is_dir() and p.name[len("iter_"):].isdigit())
        for step in done:
            if saved < step <= min(tracked, logged):
                src = checkpoint_dir / iteration_dir(step - 1)
                ctx.save_checkpoint(step, lambda dst, src=src: link_tree(src, Path(dst)))
                saved = step
        return saved
