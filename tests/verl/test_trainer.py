"""The verl 0.9.1 backend against verl's own configuration system, on CPU.

Every trial of the example GPU grids is turned into its override list; every distinct list
(trials that differ only by id, seed or an 8-GPU pool share one) is composed with Hydra's
compose API on verl's ``ppo_trainer`` config, its dataclasses are instantiated, verl's
``validate_config`` runs, and the correction helper (and bypass loss) dry-run on dummy tensors.
Needs ``pip install -e '.[verl]'``. The GPU smoke test at the bottom needs ``-m gpu``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from doubles import config_of, refusal

pytest.importorskip("verl")

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import BackendUnavailableError, GridError
from orchestrator.grid import expand, load_grid
from orchestrator.pools import load_catalog
from orchestrator.store import step_dir_name
from orchestrator.verl import mapping
from orchestrator.verl.preflight import (
    check_composed,
    compose,
    preflight,
    verl_config_dir,
)
from orchestrator.verl.topology import (
    checkpoint_world_size,
    portability,
    shard_names,
    world_size,
)
from orchestrator.verl.trainer import VerlTrainer

REPO = Path(__file__).resolve().parents[2]
GPU_GRIDS = ("grids/seed_study.yaml", "grids/seed_study_14b.yaml")
POOLS = load_catalog().pools
NASTY = ["a,b", "x=y", "~/data/train.parquet", "+extra", "$(touch /tmp/pwned)", "`id`",
         "line1\nline2", "it's", "back\\slash", "tail\\", "$HOME", "$ {x}", "\\'q",
         "[1,2]", "{a: 1}", "null", "true", "1e-3", " spaced ", "#c", "a;b|c&d", "'", "é"]


def _expanded(path: str) -> tuple[Any, list[Any]]:
    grid = load_grid(REPO / path)
    return grid, expand(grid)


def _cfg_job(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The job's argv with ``--cfg job``: verl composes and prints its config, then exits."""
    dry = argv[:3] + ["--cfg", "job"] + argv[3:]
    return subprocess.run(dry, capture_output=True, text=True, timeout=300, cwd=REPO, check=False)


# --------------------------------------------------------------------------- every trial


@pytest.fixture(scope="module")
def composed() -> dict[str, Any]:
    """Compose + instantiate every distinct override list of every trial of the GPU grids."""
    start = time.monotonic()
    per_list: dict[tuple[str, ...], list[Any]] = {}
    n_trials = 0
    for path in GPU_GRIDS:
        grid, trials = _expanded(path)
        n_trials += len(trials)
        for t in trials:
            items = VerlTrainer.overrides(t, grid.trial_config(t))
            assert items == VerlTrainer.job(grid.trial_config(t)).describe(t)
            assert f"trainer.experiment_name='{t.trial_id}'" in items
            assert f"trainer.project_name='{grid.name}'" in items
            assert f"trainer.total_training_steps={t.steps}" in items
            # Trial identity (id, seed) does not change what verl checks: share the compose.
            key = VerlTrainer.overrides(dataclasses.replace(t, trial_id="t0", seed=0),
                                        grid.trial_config(t))
            per_list.setdefault(tuple(key), []).append((grid, t))
    results = {}
    with verl_config_dir():
        for items, members in per_list.items():
            cfg = compose(list(items))
            results[items] = (cfg, check_composed(cfg, label=members[0][1].trial_id), members)
    elapsed = time.monotonic() - start
    print(f"\ncomposed {len(results)} distinct override lists for {n_trials} trials "
          f"in {elapsed:.1f} s")
    return {"results": results, "trials": n_trials}


def test_every_trial_of_the_gpu_grids_composes_and_instantiates(composed: dict[str, Any]) -> None:
    assert composed["trials"] >= 300  # both grids expanded (209 + 160 at the time of writing)
    assert len(composed["results"]) >= 90
    for cfg, built, members in composed["results"].values():
        grid, trial = members[0]
        c = CorrectionSpec.model_validate(grid.trial_config(trial)["correction"]).canonical()
        rc, actor = built["rollout_correction"], built["actor"]
        # The composed values are the mapped ones, read back from verl's own config objects.
        assert rc.rollout_is == (None if c.is_level == "none" else c.is_level)
        assert rc.bypass_mode == (c.policy == "bypass")
        assert rc.rollout_is_batch_normalize == (c.batch_norm and c.is_level != "none")
        if c.is_level != "none" and c.is_mode == "mask":
            assert rc.rollout_is_threshold == f"{c.is_lo:g}_{c.is_hi:g}"  # IcePop band
        elif c.is_level != "none":
            assert rc.rollout_is_threshold == c.is_hi  # TIS cap
        if c.rs == "geometric":
            lo, hi = c.rs_lo_hi  # IS-ratio band -> verl's k1 direction (-log ratio)
            assert rc.rollout_rs == "seq_mean_k1"
            # exact floats: verl compares with the very numbers the simulator uses
            assert tuple(map(float, rc.rollout_rs_threshold.split("_"))) == (1 / hi, 1 / lo)
        if c.rs == "off" and not c.rs_filters:
            assert rc.rollout_rs is None
        assert actor.policy_loss.loss_mode == ("bypass_mode" if c.policy == "bypass" else "vanilla")
        assert built["rollout"].name == "sglang" and built["rollout"].calculate_log_probs
        assert cfg.trainer.logger == ["console", "file"]
        assert cfg.trainer.n_gpus_per_node == POOLS[trial.pool].gpus_per_node


def test_bypass_reaches_the_actor_loss_in_the_composed_config(composed: dict[str, Any]) -> None:
    bypass = [(cfg, b) for cfg, b, _ in composed["results"].values()
              if b["rollout_correction"].bypass_mode]
    assert bypass, "the 14B grid has bypass trials"
    from verl.utils.config import omega_conf_to_dataclass

    for cfg, built in bypass:
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        assert actor.policy_loss.loss_mode == "bypass_mode"
        mirrored = actor.policy_loss.rollout_correction
        assert mirrored["loss_type"] == built["rollout_correction"].loss_type == "reinforce"
        assert mirrored["bypass_mode"] is True
    # Without the actor keys (verl's documented way) the check must catch the silent no-op.
    cfg, _ = bypass[0]
    items = [i for i in _items_of(composed, cfg) if "policy_loss" not in i]
    with verl_config_dir(), pytest.raises(GridError, match="bypass would be silently ignored"):
        check_composed(compose(items))


def test_the_shared_hydra_file_cache_composes_the_same_configs(composed: dict[str, Any]) -> None:
    from omegaconf import OmegaConf

    lists = [list(k) for k in composed["results"]][::20]
    with verl_config_dir(cache=False):
        plain = [OmegaConf.to_yaml(compose(items)) for items in lists]
    assert [OmegaConf.to_yaml(composed["results"][tuple(items)][0]) for items in lists] == plain


def _items_of(composed: dict[str, Any], cfg: Any) -> list[str]:
    return next(list(k) for k, (c, _, _) in composed["results"].items() if c is cfg)


# --------------------------------------------------------------------------- refusals


def _refusal(corr: dict[str, Any] | None = None, roll: dict[str, Any] | None = None,
             pool: str = "h100") -> str | None:
    c = CorrectionSpec.model_validate(corr or {}).canonical()
    return refusal(VerlTrainer, config_of(POOLS[pool], c, RolloutSpec.model_validate(roll or {})))


REFUSED = [
    ({"is_level": "geometric"}, None, "h100", "no geometric IS weights", "rs: geometric"),
    ({"is_level": "token", "is_mode": "clip"}, None, "h100", "from above only",
     "is_mode: truncate"),
    ({"veto": 1e-4}, None, "h100", "removed the per-token veto", "seq_max_k2: 42.4"),
    ({"opsm": 1e-4}, None, "h100", "no off-policy sequence masking", "seq_mean_k1"),
    ({"routing_replay": "R3"}, None, "h100", "MoE", "routing_replay: off"),
    ({"rs": "token", "denominator": "original"}, None, "h100",
     "correction.denominator: original with rejection", "denominator: renormalized"),
    ({"rs": "token", "policy": "bypass", "loss_type": "reinforce"}, None, "h100",
     "correction.denominator: renormalized with policy: bypass", "denominator: original"),
    ({"rs_filters": {"seq_max_k2": 2.0}, "policy": "bypass"}, None, "h100",
     "counted the mini-batch's tokens", "policy: decoupled"),
    ({"rs": "token", "rs_filters": {"token_k1": "0.5_2.0"}}, None, "h100", "also sets",
     "keep one"),
    (None, {"deterministic": True}, "h100", "identical", "drop rollout.deterministic"),
    (None, {"sampling_seed_per_request": True}, "h100", "sends none", "sim"),
    (None, {"weight_lag": 2}, "h100", "separate_async", "weight_lag: 0"),
    (None, {"reduction_order": "reversed"}, "h100", "no switch", "drop rollout.reduction_order"),
    (None, {"attention_backend": "fa3"}, "a100", "Hopper", "flashinfer"),
    (None, {"attention_backend": "fa3"}, "l20", "Hopper", "flashinfer"),
    (None, {"kv_cache_dtype": "fp8"}, "a100", "FP8", "exclude fp8"),
    (None, {"kv_cache_dtype": "fp32"}, "h100", "kv_cache_dtype takes auto", "fp8"),
    (None, None, "sim-h100", "no GPUs", "gpu pools"),
]


@pytest.mark.parametrize("corr,roll,pool,reason,fix", REFUSED)
def test_unsupported_combinations_are_refused_with_reason_and_fix(
        corr: Any, roll: Any, pool: str, reason: str, fix: str) -> None:
    msg = _refusal(corr, roll, pool)
    assert msg is not None and reason in msg and fix in msg
    assert "\n" not in msg


@pytest.mark.parametrize("corr,roll,pool", [
    ({"is_level": "sequence", "is_mode": "truncate", "batch_norm": True}, None, "h100"),
    ({"is_level": "token", "is_mode": "mask", "denominator": "original"}, None, "h100"),
    # verl computes what the simulator computes for these (tests/backends/test_correction_parity.py):
    ({"is_level": "token", "is_mode": "mask"}, None, "h100"),  # IcePop, nothing rejected
    ({"is_level": "sequence", "is_mode": "mask", "rs": "token", "rs_bounds": [0.5, 2.0]}, None,
     "h100"),  # IcePop + RS: both renormalise over the RS survivors
    ({"rs_filters": {"token_k1": "0.5_5.0"}}, None, "h100"),  # asymmetric k1, verl's direction
    ({"is_level": "token", "policy": "bypass"}, None, "h100"),  # weights for metrics, as verl
    ({"rs": "geometric", "rs_bounds": [0.999, 1.001], "policy": "bypass",
      "loss_type": "reinforce", "denominator": "original"}, None, "h100"),
    ({"rs": "geometric", "rs_bounds": [0.999, 1.001]}, None, "l20"),
    ({"rs": "token", "rs_bounds": [0.5, 5.0]}, None, "h100"),  # asymmetric: converted, not refused
    ({"is_level": "token", "policy": "bypass", "loss_type": "reinforce"}, None, "h100"),
    ({"rs_filters": {"seq_max_k2": 2.5, "token_k1": "0.5_2.0"}}, None, "h100"),
    (None, {"attention_backend": "fa3", "lm_head_fp32": True, "chunked_prefill": False}, "h20"),
    (None, {"kv_cache_dtype": "fp8", "dtype": "fp8"}, "l20"),
])
def test_supported_combinations_pass(corr: Any, roll: Any, pool: str) -> None:
    assert _refusal(corr, roll, pool) is None


def test_plan_time_refusal_names_the_grid_and_the_nearest_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(textwrap.dedent("""\
        name: refuse
        recipe: verl/qwen3_4b_dapo
        backend: verl
        steps: 10
        pool: h100
        axes:
          correction.is_level: [token, geometric]
        """))
    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    with pytest.raises(GridError) as err:
        expand(load_grid(grid))
    msg = str(err.value)
    assert msg.startswith(f"{grid}:") and "correction.is_level=geometric" in msg
    assert "no geometric IS weights" in msg and "seq_mean_k1" in msg and "\n" not in msg


def test_a_bad_value_hydra_lets_through_is_caught_by_the_preflight() -> None:
    grid, trials = _expanded(GPU_GRIDS[0])
    t = trials[0]
    items = VerlTrainer.overrides(t, grid.trial_config(t))
    bad = [i for i in items if not i.startswith("algorithm.rollout_correction.rollout_is=")]
    with pytest.raises(GridError, match="Invalid rollout_is"):
        preflight([bad + ["algorithm.rollout_correction.rollout_is=geometric"]])
    no_rs = [i for i in items if not i.startswith("algorithm.rollout_correction.rollout_rs=")]
    with pytest.raises(GridError, match="rollout_rs_threshold"):
        preflight([no_rs + ["algorithm.rollout_correction.rollout_rs=token_k1"]])
    with pytest.raises(GridError, match="not in struct|Could not override"):
        preflight([items + ["algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"]])


def test_validate_runs_verls_own_config_checks() -> None:
    grid, trials = _expanded(GPU_GRIDS[0])
    t = trials[0]
    VerlTrainer.validate(t, grid.trial_config(t))  # passes as it is
    for key, value, match in [
            ("loss_agg_mode", "bogus", "Invalid loss_agg_mode: bogus"),  # verl's dataclasses
            ("use_dynamic_bsz", False, "ppo_micro_batch_size"),  # then micro batches are needed
    ]:
        cfg = grid.trial_config(t).updated({f"actor_rollout_ref.actor.{key}": value})
        with pytest.raises(GridError, match=match):
            VerlTrainer.validate(t, cfg)
    for estimator, match in [("bogus", "Unknown advantage estimator"), ("gae", "needs a critic")]:
        cfg = grid.trial_config(t).updated({"algorithm.adv_estimator": estimator})
        with pytest.raises(GridError, match=match):
            VerlTrainer.validate(t, cfg)


def test_recipe_values_are_checked_before_any_job_starts() -> None:
    grid, trials = _expanded(GPU_GRIDS[0])
    t = trials[0]
    cfg = grid.trial_config(t).updated({"actor_rollout_ref.rollout.n": 1})
    with pytest.raises(GridError, match="GRPO needs >= 2 samples"):
        VerlTrainer.overrides(t, cfg)
    cfg = grid.trial_config(t).updated({"data.train_batch_size": 3,
                                        "actor_rollout_ref.rollout.n": 3})
    with pytest.raises(GridError, match="not divisible by the 8 GPUs"):
        VerlTrainer.overrides(t, cfg)
    cfg = grid.trial_config(t).updated({"trainer.project_name": "x"})
    with pytest.raises(GridError, match="which the verl backend sets itself"):
        VerlTrainer.overrides(t, cfg)


# --------------------------------------------------------------------------- semantics


def test_k1_rejection_bounds_are_converted_to_verls_direction() -> None:
    """rs: token with rs_bounds [0.5, 5] must keep IS ratios in [0.5, 5] once in verl."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    c = CorrectionSpec.model_validate({"rs": "token", "rs_bounds": [0.5, 5.0]})
    s = mapping.correction_settings(c)
    assert (s["rollout_rs"], s["rollout_rs_threshold"]) == ("token_k1", "0.2_2")
    ratios = torch.tensor([[3.0, 0.3, 1.0, 6.0]])  # pi_train / pi_rollout per token
    rollout_lp = torch.full_like(ratios, -1.0)
    _, mask, _ = compute_rollout_correction_and_rejection_mask(
        old_log_prob=rollout_lp + ratios.log(), rollout_log_prob=rollout_lp,
        response_mask=torch.ones_like(ratios), rollout_rs=s["rollout_rs"],
        rollout_rs_threshold=s["rollout_rs_threshold"])
    assert mask.tolist() == [[1.0, 0.0, 1.0, 0.0]]  # 3 kept, 0.3 and 6 rejected


def test_mask_mode_is_icepop_weights_zeroed_tokens_kept() -> None:
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    c = CorrectionSpec.model_validate({"is_level": "token", "is_mode": "mask",
                                       "is_bounds": [0.5, 5.0], "denominator": "original"})
    s = mapping.correction_settings(c)
    ratios = torch.tensor([[3.0, 0.3, 1.0, 6.0]])
    rollout_lp = torch.full_like(ratios, -1.0)
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=rollout_lp + ratios.log(), rollout_log_prob=rollout_lp,
        response_mask=torch.ones_like(ratios), rollout_is=s["rollout_is"],
        rollout_is_threshold=s["rollout_is_threshold"])
    w = weights.batch["rollout_is_weights"][0].tolist()
    assert [round(x, 4) for x in w] == [3.0, 0.0, 1.0, 0.0]
    assert mask.tolist() == [[1.0, 1.0, 1.0, 1.0]]  # tokens stay in the denominator
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(0.5)  # IcePop's metric


def test_engine_flags_map_to_sglang_kwargs_and_replace_recipe_values() -> None:
    grid, trials = _expanded(GPU_GRIDS[0])
    t = trials[0]
    cfg = grid.trial_config(t).updated(
        {f"rollout.{k}": v for k, v in {"lm_head_fp32": True, "kv_cache_dtype": "fp8",
                                        "attention_backend": "triton", "chunked_prefill": False,
                                        "enforce_eager": True, "free_cache_engine": False,
                                        "temperature": 0.7, "dtype": "fp16"}.items()},
        pool=POOLS["h100"])
    items = VerlTrainer.overrides(t, cfg)
    sg = "+actor_rollout_ref.rollout.engine_kwargs.sglang."
    for expected in (f"{sg}enable_fp32_lm_head=true", f"{sg}kv_cache_dtype='fp8_e4m3'",
                     f"{sg}attention_backend='triton'", f"{sg}chunked_prefill_size=-1",
                     "actor_rollout_ref.rollout.enforce_eager=true",
                     "actor_rollout_ref.rollout.free_cache_engine=false",
                     "actor_rollout_ref.rollout.dtype='float16'"):
        assert expected in items
    temps = [i for i in items if i.startswith("actor_rollout_ref.rollout.temperature=")]
    assert temps == ["actor_rollout_ref.rollout.temperature=0.7"]  # the recipe's 1.0 replaced
    with verl_config_dir():
        cfg_v = compose(items)
    assert cfg_v.actor_rollout_ref.rollout.engine_kwargs.sglang.enable_fp32_lm_head is True
    assert cfg_v.actor_rollout_ref.rollout.engine_kwargs.sglang.chunked_prefill_size == -1


# --------------------------------------------------------------------------- injection


def test_hydra_values_round_trip_through_verls_config() -> None:
    with verl_config_dir():
        cfg = compose(["actor_rollout_ref.rollout.name=sglang",
                       mapping.override("data.train_files", NASTY),
                       mapping.override("actor_rollout_ref.model.path", "a,b=c"),
                       mapping.override("data.max_prompt_length", 77)])
    assert list(cfg.data.train_files) == NASTY
    assert cfg.actor_rollout_ref.model.path == "a,b=c"
    assert cfg.data.max_prompt_length == 77
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)  # what verl's main_ppo does before anything reads the config
    assert list(cfg.data.train_files) == NASTY


def test_grid_values_are_inert_in_the_job_command_and_the_cfg_job_dry_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One grid with hostile values -> one job argv -> verl's own `--cfg job` dry run."""
    nasty = "/d/x,y=z ~+$(touch /tmp/pwned)\nnext'q\\ $HOME\\"
    grid = tmp_path / "g.yaml"
    grid.write_text(json.dumps({
        "name": "inject", "recipe": "verl/qwen3_4b_dapo", "backend": "verl", "steps": 3,
        "pool": "h100", "overrides": {"data.train_files": nasty,
                                      "actor_rollout_ref.model.path": "$(id);`id`|x&y"}}))
    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    g = load_grid(grid)
    (t,) = expand(g)
    argv = VerlTrainer.command(t, g.trial_config(t).updated(pool=POOLS["h100"]),
                               checkpoint_dir=str(tmp_path / "ck, x=1"), python=sys.executable)
    assert argv[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    carrying = [a for a in argv if "touch /tmp/pwned" in a]
    assert carrying == [f"data.train_files={mapping.hydra_value(nasty)}"]  # one argv element
    proc = _cfg_job(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import yaml

    job = yaml.safe_load(proc.stdout)
    assert job["data"]["train_files"] == nasty
    assert job["actor_rollout_ref"]["model"]["path"] == "$(id);`id`|x&y"
    assert job["trainer"]["default_local_dir"] == str(tmp_path / "ck, x=1")
    assert job["trainer"]["experiment_name"] == t.trial_id
    assert job["algorithm"]["rollout_correction"]["rollout_is"] is None
    assert not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("backend", ["verl", "k8s"])  # k8s runs the same verl job
@pytest.mark.parametrize("value", ["${oc.env:HOME}", "a\\${x}", "nul\x00byte"])
def test_values_verl_would_interpolate_are_rejected_at_plan_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: Any, backend: str) -> None:
    """verl's main_ppo re-resolves its config in place: an escaped ${...} would come alive."""
    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    grid = tmp_path / "g.yaml"
    key = "data.train_files"
    grid.write_text(json.dumps({"name": "i", "recipe": "verl/qwen3_4b_dapo", "backend": backend,
                                "steps": 3, "pool": "h100", "overrides": {key: value}}))
    with pytest.raises(GridError, match="interpolation|NUL") as err:
        expand(load_grid(grid))
    assert str(err.value).startswith(str(grid)) and key in str(err.value)
    with pytest.raises(ValueError):
        mapping.hydra_value(value)
    with pytest.raises(ValueError):
        mapping.hydra_value(["ok", value])
    assert refusal(VerlTrainer, config_of(POOLS["h100"]), "values", given=[("k", ("ok", value))])


def test_override_syntax_in_grid_keys_is_rejected_at_plan_time(tmp_path: Path) -> None:
    for key in ("data.train_files=x", "+data.extra", "~data.train_files", "data.a,b"):
        grid = tmp_path / "g.yaml"
        grid.write_text(json.dumps({"name": "k", "recipe": "verl/qwen3_4b_dapo",
                                    "backend": "verl", "steps": 3, "pool": "h100",
                                    "overrides": {key: "v"}}))
        with pytest.raises(GridError):
            load_grid(grid)


def test_filter_thresholds_are_re_emitted_canonically() -> None:
    c = CorrectionSpec.model_validate({"rs_filters": {"seq_mean_k1": " 0.5_2.0\n",
                                                      "seq_max_k3": 0.01}})
    s = mapping.correction_settings(c)
    assert s["rollout_rs"] == "seq_max_k3,seq_mean_k1"
    assert s["rollout_rs_threshold"] == "0.01,0.5_2"


# --------------------------------------------------------------------------- resume / run


def test_resume_command_and_environment() -> None:
    grid, trials = _expanded(GPU_GRIDS[0])
    t = trials[0]
    argv = VerlTrainer.command(t, grid.trial_config(t), checkpoint_dir="/ck",
                               resume_path="/ck/global_step_50", save_freq=10)
    assert "trainer.resume_mode='resume_path'" in argv
    assert "trainer.resume_from_path='/ck/global_step_50'" in argv
    assert [a for a in argv if a.startswith("trainer.save_freq=")] == ["trainer.save_freq=10"]
    env = VerlTrainer.job_environment(t, tracking_uri="http://m:5000", run_id="abc",
                                  file_logger_path="/w/m.jsonl")
    assert env["MLFLOW_TRACKING_URI"] == "http://m:5000" and env["MLFLOW_RUN_ID"] == "abc"
    assert env["VERL_FILE_LOGGER_PATH"] == "/w/m.jsonl"
    assert "MLFLOW_RUN_ID" not in VerlTrainer.job_environment(t, tracking_uri=None, run_id=None,
                                                           file_logger_path="/w/m.jsonl")


def test_world_size_and_checkpoint_portability(tmp_path: Path) -> None:
    g14, trials = _expanded(GPU_GRIDS[1])
    cfg14 = g14.trial_config(trials[0])
    assert world_size(POOLS["l20"], cfg14) == 16
    step = tmp_path / "global_step_20" / "actor"
    step.mkdir(parents=True)
    for name in shard_names(16):
        (step / name).write_bytes(b"")
    saved = checkpoint_world_size(step.parent)
    assert saved == 16
    ok, why = portability(saved, POOLS["h100"], cfg14)
    assert ok and "load as they are" in why
    ok, why = portability(saved, POOLS["h100"], {"trainer": {"nnodes": 1}})
    assert not ok and "model_merger" in why and "loses the optimizer" in why


def test_plan_show_overrides_prints_each_trials_exact_list_uncut(
        capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    grid, trials = _expanded(GPU_GRIDS[0])
    assert main(["plan", GPU_GRIDS[0], "--show-overrides", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    for t in trials[:2]:
        block = out.split(f"\n{t.trial_id} ({t.pool}, seed {t.seed}) verl overrides:\n", 1)[1]
        printed = [line[2:] for line in block.split("\n\n", 1)[0].splitlines()
                   if line.startswith("  ")]
        assert printed == VerlTrainer.job(grid.trial_config(t)).describe(t)
    assert f"{trials[2].trial_id} ({trials[2].pool}" not in out  # --limit holds


def test_run_without_local_gpus_says_what_is_missing(tmp_path: Path) -> None:
    grid, trials = _expanded(GPU_GRIDS[0])

    class Ctx:
        trial, pool, attempt, workdir = trials[0], POOLS["h100"], 1, tmp_path
        checkpoint_every, resume_step = 25, None

    with pytest.raises(BackendUnavailableError, match=r"GPU|pip install -e '\.\[gpu\]'"):
        VerlTrainer().run(trials[0], grid.trial_config(trials[0]), Ctx())


# --------------------------------------------------------------------------- GPU smoke


def test_the_gpu_smoke_trial_passes_the_cpu_preflight(tmp_path: Path) -> None:
    from verl_smoke import prepare

    grid, trial = prepare(tmp_path, 3, "NVIDIA A10G")
    pool = grid.pools.pools["gpu1"]
    assert world_size(pool, grid.trial_config(trial)) == 1
    VerlTrainer.validate(trial, grid.trial_config(trial, "gpu1"))


def test_the_gpu_smoke_harness_runs_the_trial_through_ablate_run_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the same harness gets as far as the backend's GPU check, and says so."""
    from verl_smoke import run_smoke

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("ABLATE_SMOKE_MODEL", str(model))
    result = run_smoke(tmp_path, steps=3, accelerator="NVIDIA A10G", timeout=300)
    assert result["returncode"] == 1, result["stdout"]
    last = result["stderr"].strip().splitlines()[-1]
    assert "failed" in last and "GPU node" in last and "Traceback" not in result["stderr"], last
    # recorded as an infra failure with its reason, no step logged anywhere
    assert result["state"]["verdict"]["kind"] == "infra_failure"
    assert result["steps"] == [] and not any(result["mlflow"].values())


def test_the_gpu_smoke_refuses_a_model_that_is_not_a_local_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_smoke import run_smoke

    monkeypatch.setenv("ABLATE_SMOKE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(RuntimeError, match=r"not a local Hugging Face model directory.*fix:"):
        run_smoke(tmp_path, steps=3, accelerator="NVIDIA A10G")


@pytest.mark.gpu
def test_gpu_smoke_tiny_model_streams_metrics_into_the_trials_mlflow_run(tmp_path: Path) -> None:
    """Needs one node with >= 1 GPU, the SGLang stack (`ablate gpu-env sglang`) and
    $ABLATE_SMOKE_MODEL set to a local model directory; see recipes/verl/README.md."""
    from verl_smoke import run_smoke

    result = run_smoke(tmp_path, steps=3)
    assert result["returncode"] == 0, result["stderr"][-4000:]
    assert result["steps"] == [1, 2, 3]
    assert result["state"]["state"] == "done", result["state"]
    score = result["mlflow"]["critic/score/mean"]
    assert [step for step, _ in score] == [1, 2, 3]  # each step exactly once in the child run
    k3 = result["mlflow"]["rollout_corr/k3_kl"]
    assert [step for step, _ in k3] == [1, 2, 3] and all(math.isfinite(v) for _, v in k3)
    # checkpoint every 2 steps, and the final step is always saved
    saved = sorted(p.name for p in (result["trial_dir"] / "checkpoints").iterdir())
    assert step_dir_name(3) in saved, saved


# --------------------------------------------------------------------------- the run loop
# A stand-in for the verl process (a short Python script writing what verl's file logger and
# checkpoint manager write), so the watcher's streaming, hand-over and stop are tested on CPU.

FAKE_JOB = textwrap.dedent("""\
    import json, os, sys, time, subprocess
    log, ckpt, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.path.join(ckpt, "child.pid"), "w").write(str(child.pid))
    fh = open(log, "wb", buffering=0)
    def put(step, data, torn=False):
        line = json.dumps({"step": step, "data": data}).encode()
        if torn:  # a line written in two pieces, as a reader may see it
            fh.write(line[:10]); time.sleep(0.3); fh.write(line[10:] + b"\\n")
        else:
            fh.write(line + b"\\n")
    put(0, {"val-core/math_dapo/acc/mean@4": 0.25})
    if mode == "burst":  # the whole run, checkpoint 2 first, before the watcher's first look
        d = os.path.join(ckpt, "global_step_2", "actor")
        os.makedirs(d)
        open(os.path.join(d, "model_world_size_8_rank_0.pt"), "w").write("w")
        open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w").write("2")
        fh.write(b"".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.1 * s}}).encode()
                          + b"\\n" for s in (1, 2, 3)))
        child.kill()
        sys.exit(0)
    for step in (1, 2, 3):
        adv = 0.0 if mode == "same" else 1.5
        rejected = 1.0 if mode == "rejected" and step == 2 else 0.1
        put(step, {"critic/score/mean": 0.1 * step, "critic/score/max": 1.0,
                   "critic/score/min": 0.0, "critic/advantages/max": adv,
                   "critic/advantages/min": -adv, "actor/rollout_corr/k3_kl": 1e-4,
                   "actor/rollout_corr/rollout_rs_masked_fraction": rejected,
                   "note": "text is not a metric"}, torn=step == 2)
        if mode == "rejected" and step == 2:
            time.sleep(600)  # verl would train on: the watcher must end the attempt
        if mode == "empty" and step == 1:  # what verl's helper does on a batch without tokens
            with open(os.path.join(os.path.dirname(log), "x.log"), "w") as out:
                out.write("Traceback (most recent call last):\\n  ...\\nValueError: "
                          "response_mask must contain at least one valid token (1).\\n")
            child.kill()
            sys.exit(1)
        if step == 2:
            d = os.path.join(ckpt, "global_step_2", "actor")
            os.makedirs(d)
            open(os.path.join(d, "model_world_size_8_rank_0.pt"), "w").write("w")
            open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w").write("2")
        time.sleep(0.2)
    if mode == "hang":
        time.sleep(600)
    child.kill()
    """)


class FakeCtx:
    def __init__(self, tmp: Path, stop_after: int | None = None) -> None:
        self.workdir, self.attempt, self.resume_step, self.checkpoint_every = tmp, 1, None, 2
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.saved: list[tuple[int, list[str]]] = []
        self.stop_after = stop_after

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        assert not self.steps or step > self.steps[-1][0]
        self.steps.append((step, dict(metrics)))

    def save_checkpoint(self, step: int, write: Any) -> None:
        assert self.steps and self.steps[-1][0] >= step  # metrics first, as the runner requires
        dst = self.workdir / "store" / str(step)
        dst.mkdir(parents=True)
        write(dst)
        self.saved.append((step, sorted(p.name for p in dst.rglob("*.pt"))))

    def should_stop(self) -> str | None:
        if self.stop_after is not None and self.steps and self.steps[-1][0] >= self.stop_after:
            return "early stop: collapsed"
        return None


def _fake_run(tmp: Path, mode: str, ctx: FakeCtx, monkeypatch: pytest.MonkeyPatch) -> Any:
    from orchestrator.verl import files, supervise

    monkeypatch.setattr(supervise, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(supervise, "TERM_GRACE_SECONDS", 5.0)
    ckpt, log = tmp / "ck", tmp / "m.jsonl"
    ckpt.mkdir()
    script = tmp / "fake_verl.py"
    script.write_text(FAKE_JOB)
    proc = subprocess.Popen([sys.executable, str(script), str(log), str(ckpt), mode],
                            start_new_session=True)
    trial = _expanded(GPU_GRIDS[0])[1][0]
    trial = dataclasses.replace(trial, steps=3)
    result = supervise._watch(proc, trial, ctx, files.MetricTail(log, 0), ckpt, tmp / "x.log")
    return result, int((ckpt / "child.pid").read_text())


def test_the_watcher_streams_steps_and_hands_over_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = FakeCtx(tmp_path)
    result, _ = _fake_run(tmp_path, "normal", ctx, monkeypatch)
    assert result.outcome.value == "completed" and result.last_step == 3 and result.reason is None
    assert [s for s, _ in ctx.steps] == [1, 2, 3]
    first = ctx.steps[0][1]
    assert first["eval/reward"] == 0.25  # validation before training, carried into step 1
    assert "eval/reward" not in ctx.steps[1][1]
    assert first["critic/score/mean"] == pytest.approx(0.1)
    assert first["rollout_corr/k3_kl"] == 1e-4  # bypass-mode name mapped to the shared one
    assert "note" not in first and first["health/zero_advantage"] == 0.0
    assert ctx.saved == [(2, ["model_world_size_8_rank_0.pt"])]


def test_the_watcher_reports_identical_groups(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = FakeCtx(tmp_path)
    result, _ = _fake_run(tmp_path, "same", ctx, monkeypatch)
    assert all(m["health/zero_advantage"] == 1.0 for _, m in ctx.steps)
    assert result.reason and "every GRPO advantage has been 0 for 3 steps" in result.reason
    assert "identical" in result.reason and "deterministic" in result.reason


def test_stop_terminates_the_whole_process_group(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = FakeCtx(tmp_path, stop_after=3)
    result, child = _fake_run(tmp_path, "hang", ctx, monkeypatch)
    assert result.outcome.value == "stopped" and result.reason == "early stop: collapsed"
    # The job's own child (Ray / SGLang in a real run) is dead too: gone, or a zombie that
    # nobody reaps in this container (its parent, the job, was killed with it).
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


@pytest.mark.parametrize("stop_after,saved", [(1, []), (2, [2])])
def test_steps_verl_ran_past_a_stop_are_not_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_after: int, saved: list[int]) -> None:
    """verl ran ahead of the watcher (here: to its end at once). The attempt ends where an
    in-process trainer would have, at the step the stop was decided on: no later step is
    recorded and no checkpoint of a later step taken (verl's newest, 2, only once step 2 is)."""
    ctx = FakeCtx(tmp_path, stop_after=stop_after)
    result, _ = _fake_run(tmp_path, "burst", ctx, monkeypatch)
    assert (result.outcome.value, result.last_step) == ("stopped", stop_after), result
    assert [s for s, _ in ctx.steps] == list(range(1, stop_after + 1))
    assert [s for s, _ in ctx.saved] == saved


@pytest.mark.parametrize("mode,last,needle", [
    ("rejected", 2, "step 2: every response token was rejected"),
    ("empty", 1, "without a response token"),
])
def test_an_update_with_nothing_to_train_on_ends_as_a_numeric_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, last: int, needle: str) -> None:
    """As in the simulator (correction_math.empty_update): not trained on, not retried as infra."""
    ctx = FakeCtx(tmp_path)
    result, child = _fake_run(tmp_path, mode, ctx, monkeypatch)
    assert result.outcome.value == "numeric_failure" and result.last_step == last
    assert needle in (result.reason or "")
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_grid_with_a_reference_evaluator_passes_verls_own_preflight(tmp_path: Path) -> None:
    """``eval: {reference: trainer}`` is the runner's, never a verl key (verl 0.9.1 has no
    top-level ``eval``: Hydra refused ``eval.reference`` in the first real trial that set it);
    the trial's ids still carry it."""
    path = tmp_path / "g.yaml"
    path.write_text("name: g\nrecipe: verl/cpu_tiny\nbackend: verl\nsteps: 2\npool: cpu-fp32\n"
                    "eval: {reference: trainer}\n")
    grid = load_grid(path)
    (trial,) = expand(grid)
    assert dict(trial.overrides)["eval.reference"] == "trainer"
    config = grid.trial_config(trial)
    assert not [i for i in VerlTrainer.overrides(trial, config) if "eval." in i]
    VerlTrainer.validate(trial, config)
