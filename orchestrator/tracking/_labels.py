"""What an MLflow run is labelled with: a trial run's name, params and tags (axes, pool,
engine flags, lineage, attempts and cost), the versions and commit every run carries, and the
batch limits MLflow takes them in.

Apart from the runs (``_runs``, ``_grid_run``) because ``ablate publish`` (``_publish``) writes
the same labels into another store without a run object: one definition for both.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cost import cost_tags, trial_cost
from orchestrator.metrics import param_key
from orchestrator.store.records import effective_ranges
from orchestrator.tracking._store import AXES_TAG, CONFIG_TAG, PARENT_TAG, ROLE_TAG

if TYPE_CHECKING:
    from orchestrator.pools import PoolSpec
    from orchestrator.trial import Attempt, TrialSpec

THROUGH_TAG = "ablate.logged_through_step"  # last step whose metrics are all in the store
CREATION_TAG = "ablate.outbox"  # the creation token of the trial outbox that made the run
MAX_METRICS = 999  # MLflow: 1000 entities per log_batch; one slot is the THROUGH_TAG
MAX_PARAMS_TAGS = 100
MAX_TAG_LEN = 5000
VERSION_PACKAGES = ("rl-ablate", "torch", "mlflow", "ray", "verl", "sglang", "vllm", "transformers")


@functools.lru_cache(maxsize=1)
def provenance_tags() -> dict[str, str]:
    """Package versions and the git commit of the orchestrator (never environment values)."""
    tags = {"version.python": ".".join(map(str, sys.version_info[:3]))}
    for pkg in VERSION_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            tags[f"version.{pkg}"] = importlib.metadata.version(pkg)
    repo = Path(__file__).resolve().parents[2]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        if out.returncode == 0 and out.stdout.strip():
            tags["git.commit"] = tags["mlflow.source.git.commit"] = out.stdout.strip()
    return tags


def trial_run_name(trial: TrialSpec) -> str:
    label = "/".join(v for k, v in trial.axes if k != "pool")
    return f"{label or trial.recipe} {trial.pool} s{trial.seed} ({trial.trial_id})"[:240]


def trial_params(trial: TrialSpec) -> dict[str, str]:
    """Every axis value, then the seed and resolved overrides that are not axes (string values)."""
    params = {k: str(v) for k, v in trial.axes}  # a derived trial's --set values come last: they win
    params["pool"] = trial.pool  # the pool it runs on (a derived trial may move)
    params.setdefault("seed", str(trial.seed))
    params.setdefault("steps", str(trial.steps))
    for key, value in trial.overrides:
        params.setdefault(key, str(value))
    return {param_key(k): v[:6000] for k, v in params.items()}


def trial_tags(trial: TrialSpec, pool: PoolSpec, parent_run_id: str | None) -> dict[str, str]:
    tags = {ROLE_TAG: "trial", "trial_id": trial.trial_id, "grid": trial.grid,
            "backend": trial.backend, "recipe": trial.recipe, "seed": str(trial.seed),
            "pool": pool.name, "pool.kind": pool.kind, "accelerator": pool.accelerator,
            "mlflow.runName": trial_run_name(trial), **provenance_tags(),
            AXES_TAG: json.dumps([list(a) for a in trial.axes], ensure_ascii=False)}
    if trial.config:
        tags[CONFIG_TAG] = trial.config
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    if pool.kind == "gpu":
        tags["pool.gpus_per_node"], tags["pool.nodes"] = str(pool.gpus_per_node), str(pool.nodes)
        if pool.kueue_flavor:
            tags["pool.kueue_flavor"] = pool.kueue_flavor
    for key, value in trial.overrides:
        if key.startswith("rollout."):  # inference-engine flags
            tags[f"engine.{key.removeprefix('rollout.')}"] = str(value)
    if trial.derived_from:
        parent, step = trial.derived_from
        tags["derived_from"] = f"{parent}@{step}"
    return tags


def attempt_tags(attempts: Sequence[Attempt], steps: int, pool: PoolSpec | None) -> dict[str, str]:
    """Tags per attempt (pool, step range, outcome), the pool per step range and the cost."""
    tags: dict[str, str] = {"attempts": str(len(attempts)),
                            "pools": ",".join(dict.fromkeys(a.pool for a in attempts))}
    for a in attempts:
        end = "" if a.end_step is None else str(a.end_step)
        tags[f"attempt.{a.number}.pool"] = a.pool
        tags[f"attempt.{a.number}.steps"] = f"{a.start_step}-{end}"
        tags[f"attempt.{a.number}.outcome"] = a.outcome or "running"
        if a.resumed_from_step is not None:
            tags[f"attempt.{a.number}.resumed_from_step"] = str(a.resumed_from_step)
    # The run's one step axis by pool, e.g. "sim-a100:1-6,sim-h20:7-" (what compare draws).
    tags["pool_steps"] = ",".join(f"{p}:{lo}-{'' if hi is None else hi}"
                                  for p, lo, hi in effective_ranges(attempts))
    if len(attempts) > 1:
        prev = attempts[-2]
        tags["resumed_from"] = f"attempt {prev.number} on {prev.pool} at step {attempts[-1].start_step - 1}"
    # Attempts carry their pool's rate; the run's pool covers attempts recorded before that.
    tags.update(cost_tags(trial_cost(attempts, steps,
                                     pools={pool.name: pool} if pool is not None else None)))
    return tags


def _chunks(items: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _tags(mapping: Mapping[str, Any]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(str(k), str(v)[:MAX_TAG_LEN]) for k, v in mapping.items()]
