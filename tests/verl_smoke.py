"""GPU smoke run of the verl backend: a tiny model, a few GRPO steps, metrics into MLflow.

Used by ``tests/verl/test_trainer.py`` (the ``gpu``-marked smoke test, and a CPU test
that runs the same harness up to the GPU check). It builds a tiny arithmetic data set in verl's RL parquet
format (GSM8K-style ``#### answer`` so verl's built-in reward scores it), a one-GPU pool, and a
one-trial grid on the 4B recipe with small lengths and the model swapped for the *local* model
directory in ``$ABLATE_SMOKE_MODEL`` (nothing is downloaded at run time). It then runs the trial
the way a user would, ``python -m orchestrator run-trial GRID --trial ID --workdir W``, and reads
back what the orchestrator recorded: the trial's state, its ``metrics.jsonl`` and the metric
history of its child run in the workdir's MLflow store (the runner is the single MLflow writer;
verl itself logs to console and to the per-attempt file the backend streams from).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL_ENV = "ABLATE_SMOKE_MODEL"


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


def local_model() -> str:
    """The local model directory of the smoke run; a clear error when it is not one."""
    path = os.environ.get(MODEL_ENV, "")
    if not path or not (Path(path) / "config.json").is_file():
        raise RuntimeError(
            f"${MODEL_ENV}={path!r} is not a local Hugging Face model directory (no config.json); "
            "fix: download a small instruct model once, e.g. `huggingface-cli download "
            f"Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/qwen2.5-0.5b`, and set {MODEL_ENV} "
            "to that directory")
    return path


def prepare(tmp: Path, steps: int, accelerator: str, model: str = "/models/smoke",
            rollout: dict[str, Any] | None = None) -> tuple[Any, Any]:
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
        "checkpoint": {"every": 2},
        "overrides": {
            "actor_rollout_ref.model.path": model,
            "data.train_files": str(train), "data.val_files": str(val),
            "data.max_prompt_length": 256, "data.max_response_length": 128,
            "data.train_batch_size": 8, "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 4096,
            "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
            "trainer.val_before_train": False, "trainer.test_freq": -1,
            "correction.is_level": "token", **(rollout or {})}}))
    os.environ.setdefault("ABLATE_RECIPES", str(REPO / "recipes"))
    grid = load_grid(grid_file)
    (trial,) = expand(grid)
    return grid, trial


def run_smoke(tmp: Path, steps: int = 3, accelerator: str | None = None,
              timeout: float = 3600.0, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the smoke trial with ``ablate run-trial`` and collect what was recorded."""
    import mlflow

    model = local_model()
    if accelerator is None:
        import torch

        accelerator = torch.cuda.get_device_name(0)
    grid, trial = prepare(tmp, steps, accelerator, model, rollout)
    workdir = tmp / "ablate"
    argv = [sys.executable, "-m", "orchestrator", "run-trial", str(tmp / "smoke.yaml"),
            "--trial", trial.trial_id, "--workdir", str(workdir)]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    trial_dir = workdir / grid.name / "trials" / trial.trial_id
    metrics = trial_dir / "metrics.jsonl"
    steps_seen = ([json.loads(line)["step"] for line in metrics.read_text().splitlines() if line]
                  if metrics.is_file() else [])
    state = (json.loads((trial_dir / "state.json").read_text())
             if (trial_dir / "state.json").is_file() else {})
    history: dict[str, list[tuple[int, float]]] = {}
    if (workdir / "mlflow.db").is_file():
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
        exp = client.get_experiment_by_name(grid.name)
        runs = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.trial_id = '{trial.trial_id}'") if exp else []
        for run in runs:
            for key in ("critic/score/mean", "rollout_corr/k3_kl"):
                history.setdefault(key, []).extend(
                    (m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "trial_id": trial.trial_id, "steps": steps_seen, "state": state,
            "mlflow": {k: sorted(v) for k, v in history.items()}, "trial_dir": trial_dir,
            "attempts": (json.loads((trial_dir / "attempts.json").read_text())
                         if (trial_dir / "attempts.json").is_file() else {})}
