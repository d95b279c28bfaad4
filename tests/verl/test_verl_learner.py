"""``learner.*`` on the verl backend: the overrides compose in verl 0.9.1's own config and reach
the dataclasses its workers build; what verl cannot run is refused at plan time with the reason."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from doubles import config_of, refusal

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import GridError
from orchestrator.grid import expand, load_grid
from orchestrator.learner import LOSSES, LearnerSpec
from orchestrator.pools import PoolSpec, load_catalog, train_precisions
from orchestrator.verl import learner as verl_learner
from orchestrator.verl.trainer import VerlTrainer

REPO = Path(__file__).resolve().parents[2]
POOLS = load_catalog().pools


def _trial(pool: str = "h100") -> tuple[Any, Any]:
    grid = load_grid(REPO / "grids/seed_study.yaml")
    trial = next(t for t in expand(grid) if "policy" not in str(t.overrides))
    return grid, trial


def _items(learner: dict[str, Any], pool: str = "h100", **recipe: Any) -> list[str]:
    grid, t = _trial()
    sets = {"learner": learner, "correction": {}}
    sets.update({key.replace("__", "."): value for key, value in recipe.items()})
    return VerlTrainer.overrides(t, grid.trial_config(t).updated(sets, pool=POOLS[pool]))


def test_every_loss_mode_composes_and_reaches_the_actor_config() -> None:
    pytest.importorskip("verl")
    from orchestrator.verl.preflight import check_composed, compose, verl_config_dir

    for mode in LOSSES:
        items = _items({"loss": mode, "precision": "fp16", "deterministic": True})
        with verl_config_dir():
            cfg = compose(items)
        built = check_composed(cfg, label=mode)
        assert built["actor"].policy_loss.loss_mode == mode
        fsdp = cfg.actor_rollout_ref.actor.fsdp_config
        assert fsdp.mixed_precision.param_dtype == "fp16" and fsdp.full_determinism is True


def test_max_staleness_maps_to_separate_async_with_its_startup_constraints() -> None:
    pytest.importorskip("verl")
    from orchestrator.verl.preflight import compose, verl_config_dir

    items = _items({"max_staleness": 2})
    with verl_config_dir():
        cfg = compose(items)
    v1 = cfg.trainer.v1
    assert cfg.trainer.use_v1 and v1.trainer_mode == "separate_async"
    assert v1.sampler.max_off_policy_threshold == 2
    # verl's asserts in trainer_separate_async.py, on the composed config:
    assert (cfg.data.train_batch_size
            == v1.separate_async.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.nnodes > 0 and rollout.n_gpus_per_node > 0
    assert rollout.checkpoint_engine.backend != "naive"
    assert rollout.n_gpus_per_node + cfg.trainer.n_gpus_per_node == POOLS["h100"].gpus_per_node


def test_staleness_that_breaks_the_batch_constraint_is_refused() -> None:
    with pytest.raises(GridError, match="parameter_sync_step x actor.ppo_mini_batch_size"):
        _items({"max_staleness": 2}, actor_rollout_ref__actor={"ppo_mini_batch_size": 24})


@pytest.mark.parametrize(("learner", "corr", "pool", "needle"), [
    ({"loss": "gspo"}, {"policy": "bypass"}, "h100", "bypass mode replaces the policy loss"),
    ({"precision": "fp16"}, {}, "cpu-fp32", "trains in fp32 or bf16 only"),
    ({"preset": "true_on_policy"}, {}, "h100", "vllm_async_server.py:627"),
    ({"preset": "true_on_policy"}, {}, "cpu-bf16", "computes in bfloat16"),
    ({"preset": "true_on_policy"}, {}, "cpu", "would share a seed"),
    ({"max_staleness": 1}, {}, "cpu-fp32", "checkpoint_engine.backend"),
])
def test_refusals_name_key_value_and_fix(learner: dict, corr: dict, pool: str, needle: str) -> None:
    why = refusal(VerlTrainer, config_of(POOLS[pool], CorrectionSpec(**corr), RolloutSpec(),
                                         LearnerSpec(**learner)))
    assert why and needle in why and "fix:" in why
    key, value = next(iter(learner.items()))
    assert f"learner.{key}: {value}" in why


def test_precision_gating_by_hardware() -> None:
    assert train_precisions("gpu", "B200") == ("fp32", "bf16", "fp16")
    assert train_precisions("gpu", "MI300X") == ("fp32", "bf16", "fp16")
    assert train_precisions("gpu", "V100") is None  # unknown: refused, not guessed
    v100 = PoolSpec(name="v100", kind="gpu", accelerator="V100", gpus_per_node=8)
    why = verl_learner.check_learner(LearnerSpec(precision="bf16"), CorrectionSpec(),
                                     RolloutSpec(), v100)
    assert why and "not in orchestrator/pools.py" in why


def test_learner_precision_replaces_the_cpu_pools_fp32_trainer() -> None:
    grid = load_grid(REPO / "grids/verl_cpu_learner.yaml")
    trial = next(t for t in expand(grid) if dict(t.axes)["learner"] == "dppo-bf16")
    items = VerlTrainer.overrides(trial, grid.trial_config(trial, "cpu-fp32"))
    dtypes = [i for i in items if "mixed_precision.param_dtype" in i]
    assert dtypes == ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype='bf16'"]
