"""A CPU rollout engine for verl 0.9.1, registered through verl's two rollout registries.

* ``RolloutReplicaRegistry.register(name, loader)`` (``workers/rollout/replica.py``): the replica
  class the trainer's ``LLMServerManager`` builds; it starts the server actor.
* ``_ROLLOUT_REGISTRY[(name, "async")]`` (``workers/rollout/base.py``): the fully qualified name
  of the adapter each training worker builds; it pushes the trainer's weights to the server.
  verl exposes no function for this one, so the entry is added to the dict it reads.

Select it with ``actor_rollout_ref.rollout.name=cpu`` (and ``rollout.mode=async``, the default).
"""
from __future__ import annotations

ROLLOUT_NAME = "cpu"
ADAPTER_FQN = "orchestrator.verl.cpu.rollout.adapter.CpuServerAdapter"


def _load_replica() -> type:
    # imports ray and verl: only when verl asks for the replica
    from orchestrator.verl.cpu.rollout.replica import CpuRolloutReplica

    return CpuRolloutReplica


def register(name: str = ROLLOUT_NAME) -> None:
    """Make ``rollout.name=<name>`` resolve to the CPU replica and adapter (idempotent)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(name, _load_replica)
    _ROLLOUT_REGISTRY[(name, "async")] = ADAPTER_FQN
