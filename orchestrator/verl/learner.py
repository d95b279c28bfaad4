"""``learner.*`` -> verl 0.9.1 Hydra overrides, and what verl cannot run (plan time, no verl import).

Kept apart from ``mapping`` (corrections, engine flags) so each vocabulary has one mapping
table. Facts: ``research/engines-and-axes.md`` 1c items 1, 5, 9 and verl 0.9.1's source:
``core_algos.register_policy_loss``, ``workers/engine/fsdp/transformer_impl.py``
(``_build_fsdp_module``: mixed precision, fp16 ``ShardedGradScaler``),
``trainer/ppo/v1/trainer_separate_async.py`` (its start-up asserts),
``workers/rollout/vllm_rollout/vllm_async_server.py`` (the determinism seed).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.backends.config import TrialConfig
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.learner import LOSS_SETTINGS, LearnerSpec, combination_problem
from orchestrator.pools import PoolSpec, train_precisions
from orchestrator.verl import engines
from orchestrator.verl.mapping import ACTOR_LOSS, override
from orchestrator.verl.topology import config_value

ACTOR = "actor_rollout_ref.actor"
V1 = "trainer.v1"
# learner key -> (verl key, how the value is written); one table, read by the docs too.
VERL_KEYS: dict[str, str] = {
    "loss": f"{ACTOR_LOSS}.loss_mode",
    "precision": f"+{ACTOR}.fsdp_config.mixed_precision.param_dtype (reduce/buffer fp32)",
    "deterministic": f"{ACTOR}.fsdp_config.full_determinism",
    "max_staleness": f"{V1}.trainer_mode=separate_async, {V1}.sampler.max_off_policy_threshold, "
                     f"{V1}.separate_async.parameter_sync_step",
    # the loss settings: verl's ActorConfig keys of the same name (workers/config/actor.py:159-164);
    # a loss's companions (learner.LOSS_COMPANIONS) arrive here as learner.* keys of the trial
    **{key: f"{ACTOR}.{key}" for key in LOSS_SETTINGS},
}
# Why verl 0.9.1 cannot run the true on-policy bundle on GPU pools (checked in its source).
TRUE_ON_POLICY_GPU = (
    "verl 0.9.1 gives no rollout engine a per-sample sampling seed: SGLang's deterministic "
    "inference samples every request without a sampling_seed with seed 42 (SGLang 0.5.12 "
    f"{engines.SGLANG_SEED_42}) and verl's agent loop sends none ({engines.VERL_NO_SEED}); vLLM's full_determinism (V0 trainer only, trainer.use_v1=false) injects seed = "
    "replica_rank + rollout.seed into every request (vllm_async_server.py:627), so the rollout.n "
    "samples of a prompt come out identical and every GRPO advantage is 0; fix: the sim backend, "
    "or learner.deterministic: true alone (a deterministic trainer)")
# On the cpu pools the project's own rollout engine has the hook verl lacks: a per-sample seed.
CPU_ENGINE = "+actor_rollout_ref.rollout.engine_kwargs.cpu"
FP32_TRAINER = "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
STALENESS_CPU = (
    "verl's separate_async trainer asserts actor_rollout_ref.rollout.checkpoint_engine.backend "
    "!= naive, and its weight-transfer backends (nccl, nixl, mooncake, hccl) need GPUs or RDMA; "
    "the cpu pools have gloo only; fix: a gpu pool, or rollout.weight_lag on the sim backend")


def check_learner(learner: LearnerSpec, correction: CorrectionSpec, rollout: RolloutSpec,
                  pool: PoolSpec) -> str | None:
    """Why verl 0.9.1 cannot run ``learner`` with this correction and engine on ``pool``."""
    problem = combination_problem(learner, correction, rollout)
    if problem:
        return problem
    if learner.precision is not None:
        have = train_precisions(pool.kind, pool.accelerator)
        if have is None:
            return (f"learner.precision: {learner.precision}: pool {pool.name!r} has accelerator "
                    f"{pool.accelerator!r}, which is not in orchestrator/pools.py "
                    "(COMPUTE_CAPABILITY / ROCM_ARCH); fix: add it there, or drop learner.precision")
        if learner.precision not in have:
            return (f"learner.precision: {learner.precision}: pool {pool.name!r} "
                    f"({pool.accelerator}) trains in {' or '.join(have)} only"
                    + (" (fp16 autocast with ShardedGradScaler on gloo is not supported on CPU)"
                       if pool.kind == "cpu" else " (no bf16 tensor cores below compute "
                       "capability 8.0)") + f"; fix: learner.precision: {have[-1]}, or another pool")
    if learner.preset == "true_on_policy":
        if pool.kind != "cpu":
            return "learner.preset: true_on_policy: " + TRUE_ON_POLICY_GPU
        engine = str(pool.verl_overrides.get("actor_rollout_ref.rollout.dtype", "bfloat16"))
        trainer = str(pool.verl_overrides.get(FP32_TRAINER, "bf16"))
        if rollout.dtype not in (None, "fp32") or (rollout.dtype is None and engine != "float32") \
                or trainer != "fp32":
            return (f"learner.preset: true_on_policy on pool {pool.name!r}: its rollout engine "
                    f"computes in {rollout.dtype or engine} and its trainer in {trainer}; the "
                    "engine reproduces the trainer only when both are fp32; fix: pool cpu-fp32 "
                    "(or rollout.dtype: fp32)")
        if pool.gpus_per_node * pool.nodes > 1:
            return (f"learner.preset: true_on_policy on pool {pool.name!r}: its "
                    f"{pool.gpus_per_node * pool.nodes} ranks run as many rollout replicas, each "
                    "counting sample indices from 0, so two samples of one prompt on two replicas "
                    "would share a seed; fix: pool cpu-fp32 (one rank)")
    if learner.max_staleness is not None and pool.kind == "cpu":
        return f"learner.max_staleness: {learner.max_staleness}: {STALENESS_CPU}"
    return None


def staleness_problem(config: TrialConfig, pool: PoolSpec) -> str | None:
    """verl's separate_async start-up constraints on the resolved config (plan time)."""
    learner = config.learner
    if learner.max_staleness is None or pool.kind != "gpu":
        return None
    tbs = config_value(config, "data.train_batch_size", None)
    mbs = config_value(config, f"{ACTOR}.ppo_mini_batch_size", None)
    if not (isinstance(tbs, int) and isinstance(mbs, int) and mbs > 0 and tbs % mbs == 0):
        return (f"learner.max_staleness: separate_async asserts data.train_batch_size == "
                f"parameter_sync_step x actor.ppo_mini_batch_size, got {tbs} and {mbs}; fix: "
                "a train_batch_size that is a multiple of ppo_mini_batch_size")
    if pool.gpus_per_node < 2 or pool.gpus_per_node % 2:
        return (f"learner.max_staleness: separate_async runs the rollout on its own GPUs (half "
                f"of each node here); pool {pool.name!r} has {pool.gpus_per_node} per node; fix: "
                "a pool with an even number of GPUs per node")
    half = pool.gpus_per_node // 2
    nodes = config_value(config, "trainer.nnodes", None) or pool.nodes
    n = config_value(config, "actor_rollout_ref.rollout.n", 1)
    if (tbs * n) % (half * nodes) or (mbs * n) % (half * nodes):
        return (f"learner.max_staleness: the trainer gets {half * nodes} GPUs under separate_async"
                f"; train_batch_size x rollout.n ({tbs * n}) and ppo_mini_batch_size x rollout.n "
                f"({mbs * n}) must be multiples of it; fix: change the batch sizes")
    return None


def learner_overrides(learner: LearnerSpec, config: Mapping[str, Any],
                      pool: PoolSpec) -> list[str]:
    """The Hydra overrides for ``learner`` (call :func:`check_learner` first)."""
    out: list[str] = []
    if learner.loss is not None:
        out.append(override(f"{ACTOR_LOSS}.loss_mode", learner.loss))
    for key in LOSS_SETTINGS:  # companions included: they replace the recipe's PPO values
        if getattr(learner, key) is not None:
            out.append(override(VERL_KEYS[key], getattr(learner, key)))
    if learner.precision is not None:
        mp = f"+{ACTOR}.fsdp_config.mixed_precision"
        out += [override(f"{mp}.param_dtype", learner.precision),
                override(f"{mp}.reduce_dtype", "fp32"), override(f"{mp}.buffer_dtype", "fp32")]
    if learner.deterministic or learner.preset == "true_on_policy":
        out.append(override(f"{ACTOR}.fsdp_config.full_determinism", True))
    if learner.preset == "true_on_policy":  # cpu pools only (check_learner)
        out += [override(f"{CPU_ENGINE}.per_sample_seed", True),
                override("actor_rollout_ref.rollout.dtype", "float32")]
    if learner.max_staleness is not None:
        tbs = config_value(config, "data.train_batch_size", 1)
        mbs = config_value(config, f"{ACTOR}.ppo_mini_batch_size", 1)
        half = pool.gpus_per_node // 2
        nodes = config_value(config, "trainer.nnodes", None) or pool.nodes
        out += [override("trainer.use_v1", True),
                override(f"{V1}.trainer_mode", "separate_async"),
                override(f"{V1}.separate_async.parameter_sync_step", tbs // mbs),
                override(f"{V1}.sampler.max_off_policy_threshold", learner.max_staleness),
                override("trainer.n_gpus_per_node", half),
                override("actor_rollout_ref.rollout.nnodes", nodes),
                override("actor_rollout_ref.rollout.n_gpus_per_node", half),
                override("actor_rollout_ref.rollout.checkpoint_engine.backend", "nccl")]
    return out
