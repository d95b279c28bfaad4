"""The cpu pools: their overrides compose in verl 0.9.1's own config, and they are the only
difference between a CPU and a GPU trial (fast: no verl job starts)."""
from __future__ import annotations

from pathlib import Path

import pytest
from doubles import config_of, refusal

pytest.importorskip("verl")

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.grid import expand, load_grid
from orchestrator.pools import load_catalog
from orchestrator.verl.preflight import check_composed, compose, verl_config_dir
from orchestrator.verl.trainer import VerlTrainer

REPO = Path(__file__).resolve().parents[2]
POOLS = load_catalog().pools


def _cpu_trials() -> list[tuple[object, dict, object]]:
    grid = load_grid(REPO / "grids" / "verl_cpu.yaml")
    return [(t, grid.trial_config(t), grid.pools.pools[t.pool]) for t in expand(grid, force=True)]


def test_every_cpu_trial_and_the_two_rank_pool_compose_in_verls_config(tmp_path: Path) -> None:
    lists = []
    for trial, config, pool in _cpu_trials():
        lists.append((pool, VerlTrainer.overrides(trial, config, assets_root=str(tmp_path))))
    trial, config, _ = _cpu_trials()[0]
    lists.append((POOLS["cpu"], VerlTrainer.overrides(trial, config.updated(pool=POOLS["cpu"]),
                                                      assets_root=str(tmp_path))))
    with verl_config_dir():
        for pool, items in lists:
            cfg = compose(items)
            built = check_composed(cfg, label=pool.name)
            assert cfg.actor_rollout_ref.rollout.name == "cpu"
            assert cfg.trainer.device == "cpu"
            want = {"cpu-bf16": "bfloat16"}.get(pool.name, "float32")
            assert built["rollout"].dtype == want
            assert cfg.trainer.n_gpus_per_node == pool.gpus_per_node == \
                cfg.ray_kwargs.ray_init.num_gpus
            mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
            assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("fp32",) * 3
            assert cfg.actor_rollout_ref.model.path.startswith(str(tmp_path))


def test_cpu_settings_come_from_the_pool_only() -> None:
    """The same trial on a gpu pool carries none of the cpu pool's overrides or environment."""
    trial, config, cpu_pool = _cpu_trials()[0]
    gpu = VerlTrainer.overrides(trial, config.updated(pool=POOLS["h100"]))
    cpu = VerlTrainer.overrides(trial, config)
    differing = {item.split("=", 1)[0].lstrip("+") for item in set(cpu) ^ set(gpu)}
    from_pool = {key.lstrip("+") for key in cpu_pool.verl_overrides}
    assert differing <= from_pool | {"trainer.n_gpus_per_node"}, differing - from_pool
    assert "actor_rollout_ref.rollout.name='sglang'" in gpu
    env = VerlTrainer.job_environment(trial, tracking_uri=None, run_id=None, file_logger_path="m",
                                  pool=POOLS["h100"])
    assert "VERL_PLATFORM" not in env and "VERL_USE_EXTERNAL_MODULES" not in env
    env = VerlTrainer.job_environment(trial, tracking_uri=None, run_id=None, file_logger_path="m",
                                  pool=cpu_pool)
    assert env["VERL_USE_EXTERNAL_MODULES"] == "orchestrator.verl.cpu.plugin"
    assert env["CUDA_VISIBLE_DEVICES"] is None  # unset in the job


@pytest.mark.parametrize("flags,needle", [
    ({"attention_backend": "fa3"}, "rollout.attention_backend: fa3"),
    ({"kv_cache_dtype": "fp8"}, "rollout.kv_cache_dtype: fp8"),
    ({"lm_head_fp32": True}, "rollout.lm_head_fp32: True"),
    ({"dtype": "fp8"}, "rollout.dtype: fp8"),
])
def test_gpu_only_engine_flags_are_refused_on_cpu_pools(flags: dict, needle: str) -> None:
    msg = refusal(VerlTrainer, config_of(POOLS["cpu-fp32"], CorrectionSpec(), RolloutSpec(**flags)))
    assert msg is not None and needle in msg and "cpu pool 'cpu-fp32'" in msg
    assert "\n" not in msg


def test_cpu_engine_flags_are_accepted() -> None:
    for flags in ({}, {"dtype": "bf16"}, {"dtype": "fp32", "temperature": 0.7}):
        assert refusal(VerlTrainer, config_of(POOLS["cpu"], CorrectionSpec(), RolloutSpec(**flags))) is None


def test_sim_backend_refuses_cpu_pools_and_verl_refuses_sim_pools() -> None:
    from orchestrator.sim.job import SimTrainer

    assert "cpu pool" in refusal(SimTrainer, config_of(POOLS["cpu-bf16"], CorrectionSpec(), RolloutSpec()))
    assert "sim-* pools belong to backend: sim" in refusal(VerlTrainer, config_of(POOLS["sim-h100"], CorrectionSpec(), RolloutSpec()))
