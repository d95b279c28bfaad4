"""Values verl checks only deep inside the job, or never, checked when the override list is
built (plan time: every command that expands a grid builds it, ``grid._trial_checks``).

Read as the job will see them: the recipe and the grid's keys, then the pool's
``verl_overrides`` (applied after them), then the engine flags of the vocabulary. GRPO's own
needs (two samples per prompt, a mini-batch dividing the batch, the engine's log-probs), the
rollout log-probs' meaning (``engines.logprob_problem``), and one name per verl setting.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import recipes
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import GridError
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec
from orchestrator.verl import engines, mapping
from orchestrator.verl.engine_choice import EngineChoice
from orchestrator.verl.topology import config_value, world_size


def check_recipe_values(trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                         rollout: RolloutSpec) -> None:
    """Values verl only checks deep inside the job (or never): fail at plan time instead. Read
    as the job will see them: the recipe and the grid's keys, then the pool's
    ``verl_overrides`` (applied after them), then the engine flags of the vocabulary."""
    pool_keys = {k.lstrip("+"): v for k, v in pool.verl_overrides.items()}
    effective = recipes.apply_overrides(config, pool_keys)

    def value(key: str, default: Any = None) -> Any:
        return config_value(effective, key, default)

    def bad(key: str, problem: str, fix: str) -> GridError:
        if key in pool_keys:  # the pool catalogue's mistake, not the grid's
            return GridError(f"pool {pool.name}: verl_overrides.{key}: {problem}",
                             fix=f"{fix}, in the pool catalogue")
        return GridError(f"{problem} (trial {trial.trial_id})", key=key, fix=fix)

    n = value("actor_rollout_ref.rollout.n", 1)
    if not isinstance(n, int) or n < 2:
        raise bad("actor_rollout_ref.rollout.n", f"GRPO needs >= 2 samples per prompt, got {n!r}",
                  "set actor_rollout_ref.rollout.n to 2 or more")
    if value("actor_rollout_ref.rollout.calculate_log_probs", True) is not True:
        raise bad("actor_rollout_ref.rollout.calculate_log_probs", "must be true: without the "
                  "engine's log-probs there is no correction and no mismatch metric", "remove it")
    name = value("actor_rollout_ref.rollout.name")
    if pool.kind == "gpu" and name not in engines.ENGINES:
        raise bad("actor_rollout_ref.rollout.name", f"the verl backend runs the rollout engines "
                  f"{', '.join(engines.ENGINES)} on gpu pools, not {name!r}",
                  "set actor_rollout_ref.rollout.name: sglang or vllm (or rollout.engine)")
    bsz = value("data.train_batch_size")
    mini = value("actor_rollout_ref.actor.ppo_mini_batch_size")
    world = world_size(pool, effective)
    if isinstance(bsz, int) and (bsz * n) % world:
        raise bad("data.train_batch_size", f"train_batch_size x rollout.n = {bsz * n} is not "
                  f"divisible by the {world} GPUs of pool {pool.name!r}",
                  "pick a batch size that divides evenly")
    if isinstance(bsz, int) and isinstance(mini, int) and (mini < 1 or bsz % mini):
        raise bad("actor_rollout_ref.actor.ppo_mini_batch_size", f"{mini} must divide "
                  f"data.train_batch_size {bsz}", "use a divisor of the batch size")
    tp = value("actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    if isinstance(tp, int) and (tp < 1 or pool.gpus_per_node % tp):
        raise bad("actor_rollout_ref.rollout.tensor_model_parallel_size", f"{tp} does not divide "
                  f"the {pool.gpus_per_node} GPUs per node of pool {pool.name!r}",
                  "use 1, 2, 4 or 8")
    engine = EngineChoice.of(rollout, pool, effective).samples_with_engine_logprobs
    mode = {"processed": "processed_logprobs", "raw": "raw_logprobs"}.get(
        rollout.logprobs_mode or "", value(engines.LOGPROBS_KEY))
    temperature = (rollout.temperature if rollout.temperature is not None
                   else value(engines.TEMPERATURE_KEY, 1.0))
    problem = engine and engines.logprob_problem(
        engine, top_p=value(engines.TOP_P_KEY), top_k=value(engines.TOP_K_KEY),
        temperature=temperature, logprobs_mode=mode, engine_env=pool.verl_env)
    if problem:
        key, why = problem
        why = why.removeprefix(f"{key}: ")
        raise bad(key, why.split("; fix: ")[0], why.split("; fix: ")[-1])


def one_name_per_setting(trial: TrialSpec, vocabulary_items: Sequence[str]) -> None:
    """A verl key the grid sets itself that a ``rollout.*`` / ``learner.*`` key of the trial
    also sets: one of the two values would silently lose (the vocabulary's is applied last)."""
    direct = {k.lstrip("+") for k, _ in trial.overrides
              if k.split(".", 1)[0] not in mapping.SECTIONS}
    vocabulary = [k for k, _ in trial.overrides if k.split(".", 1)[0] in ("rollout", "learner")]
    for item in vocabulary_items:
        key = item.split("=", 1)[0].lstrip("+")
        if key in direct:
            names = ", ".join(vocabulary) or "the learner's companion settings"
            raise GridError(f"{key} is set twice, as verl's key and through the project's "
                            f"vocabulary ({names}), which replaces it (trial {trial.trial_id})",
                            key=key, fix=f"keep one of {key} and the vocabulary key")
