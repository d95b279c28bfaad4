"""GPU smoke run of the verl backend: a tiny model, a few GRPO steps, metrics into MLflow.

Used by ``tests/test_verl_backend.py::test_gpu_smoke_...`` (marker ``gpu``). It builds a tiny
arithmetic data set in verl's RL parquet format (GSM8K-style ``#### answer`` so verl's built-in
reward scores it), a one-GPU pool, a one-trial grid on the 4B recipe with small lengths and the
model swapped for ``$ABLATE_SMOKE_MODEL`` (default Qwen/Qwen2.5-0.5B-Instruct), creates the
trial's MLflow run, and runs ``VerlBackend().run`` with a minimal RunContext.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def make_dataset(path: Path, n: int, seed: int) -> None:
    import pandas as pd

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        question = (f"What is {a} + {b}? Think briefly, then give the final answer after "
                    "'####', e.g. '#### 12'.")
        rows.append({"data_source": "openai/gsm8k",
                     "prompt": [{"role": "user", "content": question}],
                     "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"index": i}})
    pd.DataFrame(rows).to_parquet(path)


class SmokeContext:
    """A RunContext that records what the backend reports."""

    def __init__(self, trial: Any, pool: Any, workdir: Path, tracking_uri: str,
                 run_id: str) -> None:
        self.trial, self.pool, self.attempt, self.workdir = trial, pool, 1, workdir
        self.checkpoint_every, self.resume_step = 2, None
        self.tracking_uri, self.mlflow_run_id = tracking_uri, run_id
        self.steps: list[int] = []
        self.last: dict[str, float] = {}
        self.checkpoints: list[int] = []

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        assert not self.steps or step > self.steps[-1], (self.steps, step)
        self.steps.append(step)
        self.last = dict(metrics)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        d = self.workdir / "store" / f"step_{step}"
        d.mkdir(parents=True)
        write(d)
        self.checkpoints.append(step)

    def checkpoint_path(self, step: int) -> Path:
        return self.workdir / "store" / f"step_{step}"

    def should_stop(self) -> str | None:
        return None


def prepare(tmp: Path, steps: int, accelerator: str) -> tuple[Any, Any]:
    """The one-trial grid of the smoke run (also pre-flighted on CPU by the test suite)."""
    from orchestrator.grid import expand, load_grid

    train, val = tmp / "train.parquet", tmp / "val.parquet"
    make_dataset(train, 64, 0)
    make_dataset(val, 16, 1)
    (tmp / "pools.yaml").write_text(json.dumps({"pools": {"gpu1": {
        "kind": "gpu", "accelerator": accelerator, "gpus_per_node": 1, "capacity": 1}}}))
    grid_file = tmp / "smoke.yaml"
    grid_file.write_text(json.dumps({
        "name": "verl-smoke", "recipe": "verl/qwen3_4b_dapo", "backend": "verl",
        "steps": steps, "pool": "gpu1", "pool_catalog": str(tmp / "pools.yaml"),
        "overrides": {
            "actor_rollout_ref.model.path":
                os.environ.get("ABLATE_SMOKE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct"),
            "data.train_files": str(train), "data.val_files": str(val),
            "data.max_prompt_length": 256, "data.max_response_length": 128,
            "data.train_batch_size": 8, "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 4096,
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
            "trainer.val_before_train": False, "trainer.test_freq": -1,
            "correction.is_level": "token"}}))
    os.environ.setdefault("ABLATE_RECIPES", str(REPO / "recipes"))
    grid = load_grid(grid_file)
    (trial,) = expand(grid)
    return grid, trial


def run_smoke(tmp: Path, steps: int = 3) -> dict[str, Any]:
    import mlflow
    import torch

    from orchestrator.backends.verl import VerlBackend

    grid, trial = prepare(tmp, steps, torch.cuda.get_device_name(0))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(grid.name)
    run = client.create_run(exp, run_name=trial.trial_id)
    ctx = SmokeContext(trial, grid.pools.pools["gpu1"], tmp / "work", uri, run.info.run_id)
    result = VerlBackend().run(trial, grid.trial_config(trial), ctx)
    history = {key: [m.step for m in client.get_metric_history(run.info.run_id, key)]
               for key in ("critic/score/mean", "rollout_corr/k3_kl")}
    return {"logged_steps": ctx.steps, "mlflow_steps": history, "last": ctx.last,
            "checkpoints": ctx.checkpoints, "outcome": result.outcome.value}
