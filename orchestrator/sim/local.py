"""A minimal in-process RunContext for debugging one simulator trial and for benchmarks.

The real context (metrics persistence, MLflow, checkpoint store, verdicts) is
``orchestrator.run``; this one keeps metrics in memory and checkpoints under ``workdir``.
"""
from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec


@dataclasses.dataclass
class LocalContext:
    trial: TrialSpec
    pool: PoolSpec
    workdir: Path
    checkpoint_every: int = 0
    resume_step: int | None = None
    attempt: int = 1
    stop_at: int | None = None  # ask the backend to stop after this step (testing early stop)
    on_step: Callable[[int, Mapping[str, float]], None] | None = None
    metrics: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    environment: dict[str, str] = dataclasses.field(default_factory=dict)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.metrics and step <= max(self.metrics):
            raise ValueError(f"step {step} logged after step {max(self.metrics)}")
        self.metrics[step] = dict(metrics)
        if self.on_step:
            self.on_step(step, metrics)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        final = self.workdir / "checkpoints" / f"step_{step:06d}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # a checkpoint either exists whole or not at all

    def checkpoint_path(self, step: int) -> Path:
        path = self.workdir / "checkpoints" / f"step_{step:06d}"
        if not path.is_dir():
            raise FileNotFoundError(f"no checkpoint for step {step} under {self.workdir}")
        return path

    def checkpoints(self) -> list[int]:
        root = self.workdir / "checkpoints"
        return sorted(int(p.name[5:]) for p in root.glob("step_*") if not p.name.endswith(".tmp"))

    def describe_environment(self, facts: Mapping[str, str]) -> None:
        self.environment.update(facts)

    def should_stop(self) -> str | None:
        if self.stop_at is not None and self.metrics and max(self.metrics) >= self.stop_at:
            return f"stop requested after step {self.stop_at}"
        return None


def make_trial(pool: str, steps: int, seed: int = 0, overrides: Mapping[str, object] = {},
               recipe: str = "sim/grpo_tiny") -> TrialSpec:
    """A TrialSpec for a one-off run outside a grid (id derived from its content)."""
    import hashlib
    import json

    ov = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()))
    digest = hashlib.sha256(json.dumps([pool, steps, seed, recipe, repr(ov)]).encode()).hexdigest()
    return TrialSpec(trial_id="t" + digest[:12], grid="local", backend="sim", recipe=recipe,
                     pool=pool, seed=seed, steps=steps, axes=(), overrides=ov)
