"""How many GPUs a verl trial spans and whether its checkpoint can move to another pool.

verl's FSDP shards are keyed by world size (``model_world_size_<N>_rank_<r>.pt``), so a verl
checkpoint resumes only on a pool that gives the same GPU count: the verl trainer's plan-time
checks (and its ``checkpoint`` stage, which ``ablate resume`` asks), the RayJob the Kubernetes
launcher renders and a Slurm job's node count all ask this module.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.exceptions import CheckpointError, GridError
from orchestrator.pools import PoolSpec

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
RAY_INIT = "ray_kwargs.ray_init."


def config_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at a dotted key of a nested config, or ``default`` where the path ends."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def world_size(pool: PoolSpec, config: Mapping[str, Any] | None = None) -> int:
    """GPUs a trial uses on ``pool``: GPUs per node x the recipe's ``trainer.nnodes``."""
    nodes = config_value(config or {}, "trainer.nnodes", None) or pool.nodes
    if not isinstance(nodes, int) or nodes < 1:
        raise GridError(f"trainer.nnodes must be a positive integer, got {nodes!r}",
                        key="trainer.nnodes")
    return pool.gpus_per_node * nodes


def checkpoint_world_size(step_dir: str | Path) -> int | None:
    """World size a verl ``global_step_N`` checkpoint was saved with (from its shard names)."""
    actor = Path(step_dir) / "actor"
    sizes = {int(m.group(1)) for p in (actor.iterdir() if actor.is_dir() else ())
             if (m := _SHARD.match(p.name))}
    if len(sizes) > 1:
        raise CheckpointError(f"{actor}: shards of several world sizes {sorted(sizes)}")
    return sizes.pop() if sizes else None


def portability(saved_world_size: int, pool: PoolSpec, config: Mapping[str, Any] | None = None,
                others: Iterable[PoolSpec] = ()) -> tuple[bool, str]:
    """Can a checkpoint saved with ``saved_world_size`` GPUs resume on ``pool``? And what to do.

    ``others`` (the grid's pool catalog): the refusal names those of ``pool``'s kind that give
    the checkpoint's world size, the first way out.
    """
    target = world_size(pool, config)
    if target == saved_world_size:
        return True, (f"pool {pool.name!r} runs {target} GPUs like the checkpoint; the FSDP "
                      "shards load as they are (numerics change with the GPU type)")
    same = [p.name for p in others
            if p.kind == pool.kind and p.name != pool.name and _fits(p, config, saved_world_size)]
    ways = [f"resume on a {pool.kind} pool with {saved_world_size} rank(s): {', '.join(same)}"
            ] if same else []
    if pool.kind != "cpu":  # cpu pools are one node: trainer.nnodes cannot change the count
        ways.append("set trainer.nnodes so the GPU count matches")
    ways.append("merge to Hugging Face weights (python -m verl.model_merger merge --backend fsdp "
                "--local_dir <ckpt>/actor --target_dir <hf>) and start fresh from them, which "
                "loses the optimizer, scheduler and data-loader state")
    return False, (f"verl shards are keyed by world size: the checkpoint has {saved_world_size}, "
                   f"pool {pool.name!r} gives {target}; fix: {'; or '.join(ways)}")


def _fits(pool: PoolSpec, config: Mapping[str, Any] | None, world: int) -> bool:
    try:
        return world_size(pool, config) == world
    except GridError:
        return False


def shard_names(world: int) -> Sequence[str]:
    """The model shard files verl writes for ``world`` ranks (used by tests and resume checks)."""
    return [f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]


def ray_node_resources(pool: PoolSpec) -> tuple[int | None, int | None]:
    """(CPUs, GPUs) each Ray node of a multi-node job announces: the pool's ``ray_init``
    values (a cpu pool's fake GPUs), or None where Ray should detect them."""
    found: dict[str, int | None] = {"num_cpus": None, "num_gpus": None}
    for key, value in pool.verl_overrides.items():
        name = key.lstrip("+").removeprefix(RAY_INIT)
        if name in found and isinstance(value, int):
            found[name] = value
    return found["num_cpus"], found["num_gpus"]
