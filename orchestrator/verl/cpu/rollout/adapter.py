"""The worker-side rollout adapter: lives in each training worker and pushes weights to the server.

verl 0.9.1 builds it in ``ActorRolloutRefWorker.init_model`` through
``get_rollout_class(rollout.name, "async")`` (``workers/engine_workers.py:667``) and, at every
weight sync of the colocated trainer (``checkpoint_engine.backend=naive``), calls
``resume(["weights"])``, ``update_weights(per_tensor_param, peft_config=, base_sync_done=,
global_steps=)``, then ``resume(["kv_cache"])`` (``engine_workers.py`` ``update_weights``).

``per_tensor_param`` is a generator over the FSDP model's full (HF-named) tensors: with FSDP2
each item is a ``DTensor.full_tensor()`` all-gather, so every rank must consume the whole
generator even though only the replica's first rank sends to the server.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from orchestrator.verl.cpu.rollout.server import server_actor_name


class CpuServerAdapter(BaseRollout):
    """Hands the trainer's weights to this rank's CPU rollout server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any,
                 replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rollout_world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                         * self.config.pipeline_model_parallel_size)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // rollout_world if replica_rank == -1 else replica_rank
        self.is_leader = rank % rollout_world == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Weights and cache stay resident on the CPU."""

    async def release(self) -> None:
        pass

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                             wire_format: str = "named_tensors", global_steps: int | None = None,
                             peft_config: Any = None, **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"wire_format={wire_format!r}: the CPU rollout takes full "
                                      "named tensors (checkpoint_engine.backend=naive)")
        if peft_config is not None:
            raise NotImplementedError("LoRA adapters are not supported by the CPU rollout; "
                                      "merge them (actor_rollout_ref.model.lora.merge=true)")
        # Consume everything on every rank (collectives inside the generator), keep it on the leader.
        collected = {name: _owned(tensor) for name, tensor in weights}
        if not self.is_leader:
            return
        await self._server_handle().update_weights.remote(collected, global_steps)


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A full CPU tensor that does not alias the training parameters (they change next step)."""
    if hasattr(tensor, "full_tensor"):  # a DTensor shard: gather it (a collective on all ranks)
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu").clone()
