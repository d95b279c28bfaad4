"""The replica verl's ``LLMServerManager`` builds for ``rollout.name=<ours>``: it starts the server.

verl 0.9.1 creates ``world_size / rollout_world_size`` replicas (``rollout/llm_server.py``) and,
in the colocated ("hybrid") trainer, calls ``init_hybrid(worker_group)``, which hands each replica
its slice of the training workers and calls :meth:`CpuRolloutReplica.launch_servers`. Here that
starts one :class:`~orchestrator.verl.cpu.rollout.server.CpuRolloutServer` actor per replica, on the
node of its first worker, under a name the worker-side adapter can look up.

Only the hybrid mode is supported: standalone and colocated replicas receive weights through a
checkpoint engine (NCCL/NIXL), which has no CPU path.
"""
from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from orchestrator.verl.cpu.rollout.server import CpuRolloutServer, server_actor_name


class CpuRolloutReplica(RolloutReplica):
    """One CPU rollout server per replica (tensor/pipeline/data parallel size 1)."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the CPU rollout runs colocated with the trainer (hybrid mode); got "
                f"{self.rollout_mode}: standalone/colocated replicas need a checkpoint engine")
        if self.world_size != 1:
            raise NotImplementedError(
                f"the CPU rollout serves one process per replica; got tensor x data x pipeline "
                f"parallel size {self.world_size} (set them to 1)")
        node_id = await self.workers[0].__ray_call__.remote(
            lambda worker: ray.get_runtime_context().get_node_id())
        kind = "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else ""
        name = server_actor_name(self.replica_rank, kind, self.name_suffix)
        server = ray.remote(CpuRolloutServer).options(
            name=name,
            num_cpus=0,  # the colocated training worker already holds this replica's CPU share
            max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(config=self.config, model_config=self.model_config,
                 replica_rank=self.replica_rank)
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        # verl keys its load balancer by address; the actor name is unique and tells a reader more.
        self._server_address = name
