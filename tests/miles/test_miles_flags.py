"""The miles backend at plan time (no Miles import): which correction runs on which Miles
function, the refusals with their reasons, the recipe arguments it owns, the grid errors a user
sees. What Miles itself parses from these arguments: ``test_miles_parser.py``."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from doubles import refusal

from orchestrator.backends.config import TrialConfig
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import GridError
from orchestrator.grid import expand, load_grid
from orchestrator.learner import LearnerSpec
from orchestrator.miles import flags
from orchestrator.miles.trainer import MilesTrainer

# The keys of the mis.yaml Miles ships beside its MIS function (radixark/miles @31f1ca96,
# examples/infra_features/train_infer_mismatch_helper/mis.yaml): the function reads them as
# args.* attributes, so the generated file must use exactly these.
MIS_YAML_KEYS = {"use_tis", "use_rs", "tis_level", "rs_level", "tis_mode", "tis_lower_bound",
                 "tis_upper_bound", "rs_lower_bound", "rs_upper_bound", "rs_veto_threshold",
                 "tis_batch_normalize"}


def _c(**kw) -> CorrectionSpec:
    return CorrectionSpec.model_validate(kw)


def test_token_level_is_runs_on_miles_built_in_functions() -> None:
    assert flags.mis_config(_c(is_level="token")) is None
    assert flags.correction_flags(_c(is_level="token", is_bounds=(0.5, 3.0)), None) == [
        "--use-tis", "--tis-clip", "3.0", "--tis-clip-low", "0"]
    assert flags.correction_flags(_c(is_level="token", is_mode="clip", is_bounds=(None, 4.0)),
                                  None)[-2:] == ["--tis-clip-low", "0.25"]
    icepop = _c(is_level="token", is_mode="mask", denominator="original")
    assert flags.correction_problem(icepop) is None
    assert flags.correction_flags(icepop, None)[-2:] == ["--custom-tis-function-path",
                                                        flags.ICEPOP_FUNCTION]


@pytest.mark.parametrize("kw", [
    {}, {"policy": "bypass"}, {"is_level": "sequence"}, {"is_level": "geometric"},
    {"is_level": "token", "rs": "token", "rs_bounds": (0.5, 2.0)},
    {"is_level": "token", "batch_norm": True},
    {"is_level": "token", "rs": "sequence", "veto": 1e-4},
])
def test_everything_else_is_miles_mis_function_with_the_shipped_keys(kw) -> None:
    correction = _c(**kw)
    assert flags.correction_problem(correction) is None
    mis = flags.mis_config(correction)
    assert mis is not None and set(mis) == MIS_YAML_KEYS
    argv = flags.correction_flags(correction, "/tmp/mis.yaml")
    assert argv[-5:] == ["--get-mismatch-metrics", "--custom-config-path", "/tmp/mis.yaml",
                         "--custom-tis-function-path", flags.MIS_FUNCTION]
    # --use-tis exactly where an IS level weights the loss (bypass excludes it).
    assert ("--use-tis" in argv) == (correction.is_level != "none")
    assert mis["use_tis"] == (correction.is_level != "none")
    assert mis["use_rs"] == (correction.rs != "off")


@pytest.mark.parametrize("kw, words", [
    ({"rs_filters": {"token_k3": 0.01}}, "divergence filters"),
    ({"policy": "bypass", "loss_type": "reinforce"}, "PPO-clip"),
    ({"policy": "bypass", "is_level": "token"}, "excludes --use-tis"),
    ({"rs": "token", "rs_bounds": (0.5, 2.0)}, "inside its IS path"),
    ({"is_level": "token", "veto": 1e-4}, "only with rejection sampling"),
    ({"is_level": "geometric", "batch_norm": True}, "geometric-level batch"),
    ({"is_level": "token", "rs": "token", "rs_bounds": (0.5, 2.0), "denominator": "original"},
     "renormalise"),
    ({"is_level": "sequence", "is_mode": "mask", "denominator": "original"}, "renormalise"),
    ({"is_level": "token", "is_mode": "mask"}, "IcePop"),
])
def test_what_miles_cannot_express_is_refused_with_the_reason(kw, words) -> None:
    problem = flags.correction_problem(_c(**kw))
    assert problem is not None and words in problem and "; fix: " in problem


def test_engine_and_learner_refusals() -> None:
    assert "SGLang only" in flags.rollout_problem(RolloutSpec(engine="vllm"))
    assert "no setting" in flags.rollout_problem(RolloutSpec(enforce_eager=True))
    assert "no Miles/SGLang spelling" in flags.rollout_problem(RolloutSpec(kv_cache_dtype="fp16"))
    assert flags.rollout_problem(RolloutSpec(engine="sglang", temperature=0.7)) is None
    assert "fp32" in flags.learner_problem(LearnerSpec(precision="fp32"))
    assert "synchronous" in flags.learner_problem(LearnerSpec(max_staleness=1))
    top = LearnerSpec(preset="true_on_policy")
    assert flags.true_on_policy_problem(top, "Qwen3-4B-Base", False) is None
    assert "model profile" in flags.true_on_policy_problem(top, "Llama-3-8B", False)
    assert "sequence" in flags.true_on_policy_problem(top, "Qwen3-4B", True)


def test_true_on_policy_sets_miles_plan_and_its_environment() -> None:
    argv, env = flags.learner_flags(LearnerSpec(preset="true_on_policy"))
    assert {"--true-on-policy-mode", "--recompute-logprobs-via-prefill", "--deterministic-mode",
            "--batch-invariant-mode"} <= set(argv)
    assert env == {**flags.JOB_ENV, **flags.TRUE_ON_POLICY_ENV}
    assert flags.learner_flags(LearnerSpec())[1] == flags.JOB_ENV


GRID = {"name": "miles-plan", "recipe": "miles/qwen3_4b_dapo", "backend": "miles", "steps": 20,
        "seeds": [3], "pool": "h100"}


def _load(tmp_path: Path, **changes):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**GRID, **changes}))
    return load_grid(path)


def test_a_trial_is_one_miles_run_of_the_recipe(tmp_path) -> None:
    grid = _load(tmp_path, axes={"correction.is_level": ["none", "token"]})
    trials = expand(grid)
    assert len(trials) == 2
    by_level = {dict(t.axes)["correction.is_level"]: t for t in trials}
    argv, mis, env = MilesTrainer.arguments(by_level["token"],
                                            grid.trial_config(by_level["token"]),
                                            checkpoint_dir="/ckpt", save_freq=5)
    assert mis is None and env == flags.JOB_ENV
    text = " ".join(argv)
    assert "--hf-checkpoint /data/Qwen3-4B-Base" in text and "--num-rollout 20" in text
    assert "--seed 3 " in text and "--save /ckpt --save-interval 5" in text
    assert "--actor-num-nodes 1 --actor-num-gpus-per-node 8" in text
    lines = MilesTrainer.job(grid.trial_config(by_level["none"])).describe(by_level["none"])
    assert "mis.yaml use_tis: false" in lines and "--get-mismatch-metrics" in lines
    config = grid.trial_config(trials[0])
    assert TrialConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("changes, words", [
    ({"pool": "sim-h100"}, "gpu"),
    ({"axes": {"rollout.engine": ["vllm"]}}, "SGLang only"),
    ({"axes": {"learner.preset": ["true_on_policy"]},
      "overrides": {"miles.model_name": "Llama-3-8B"}}, "model profile"),
    ({"recipe": "verl/qwen3_4b_dapo"}, "no Miles arguments"),
])
def test_bad_grids_are_one_line_errors(tmp_path, changes, words) -> None:
    with pytest.raises(GridError) as err:
        expand(_load(tmp_path, **changes))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_recipe_may_not_set_what_the_backend_owns(tmp_path) -> None:
    recipes = tmp_path / "recipes" / "mine"
    recipes.mkdir(parents=True)
    mine = yaml.safe_load((Path(__file__).parents[2] / "recipes" / "miles" /
                           "qwen3_4b_dapo.yaml").read_text())
    mine["miles"]["num_rollout"] = 3000  # as Miles' example script sets it
    (recipes / "miles.yaml").write_text(yaml.safe_dump(mine))
    with pytest.raises(GridError, match="miles.num_rollout: the miles backend sets it itself"):
        expand(_load(tmp_path, recipe="mine/miles"))


def test_a_mis_correction_needs_the_pool_to_name_a_miles_checkout(tmp_path) -> None:
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {"bare": {
        "kind": "gpu", "accelerator": "H100", "gpus_per_node": 8}}}))
    with pytest.raises(GridError, match="miles.checkout"):
        expand(_load(tmp_path, pool="bare", pool_catalog=str(catalog)))
    grid = _load(tmp_path, pool="bare", pool_catalog=str(catalog),
                 overrides={"correction.is_level": "token"})
    assert len(expand(grid)) == 1  # a built-in TIS needs no checkout


def test_the_tensorboard_reader_gives_one_record_per_trial_step(tmp_path) -> None:
    """Miles' steps: train/* at rollout * steps_per_rollout + i (averaged per rollout), rollout/*
    at the rollout; rollout r is step r + 1; a step is given once a later one has begun."""
    from torch.utils.tensorboard import SummaryWriter

    from orchestrator import metrics as M
    from orchestrator.miles import events

    writer = SummaryWriter(str(tmp_path))
    tail = events.TensorBoardTail(tmp_path, 0, steps_per_rollout=2, eval_tag="aime", mis=False)
    for rollout in range(2):
        writer.add_scalar("rollout/raw_reward", 0.1 * rollout, rollout)
        for i in range(2):
            writer.add_scalar("train/grad_norm", 1.0 + i, rollout * 2 + i)
            writer.add_scalar("train/train_rollout_kl", 0.5, rollout * 2 + i)
            writer.add_scalar("train/mis_k3_kl", 9.0, rollout * 2 + i)  # not this trial's k3
        writer.add_scalar("eval/aime", 0.3, rollout)
        writer.flush()
    assert [s for s, _ in tail.poll()] == [1]  # step 2 may still grow
    (step, data), = tail.flush()
    assert step == 2 and data[M.GRAD_NORM] == 1.5 and data[M.K3_KL] == 0.5
    assert data[M.TRAIN_REWARD] == pytest.approx(0.1) and data[M.EVAL_REWARD] == pytest.approx(0.3)
    again = events.TensorBoardTail(tmp_path, 1, steps_per_rollout=2, eval_tag=None, mis=True)
    (step, data), = again.flush()  # a resumed attempt reads the files from after its step
    assert step == 2 and data[M.K3_KL] == 9.0 and M.EVAL_REWARD not in data
    writer.close()


def test_a_pool_whose_gpus_do_not_hold_the_model_parallelism_is_refused(tmp_path) -> None:
    """Megatron's world-size assert, at plan (Miles' own parser agrees on each GPU count:
    test_miles_parser.py); and a rescue or resume moving a checkpoint there is refused too."""
    catalog = tmp_path / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {
        f"g{n}": {"kind": "gpu", "accelerator": "H100", "gpus_per_node": n,
                  "miles": {"checkout": "/m"}} for n in (3, 4)}}))
    overrides = {"miles.tensor_model_parallel_size": 2, "miles.context_parallel_size": 2}
    with pytest.raises(GridError) as err:
        expand(_load(tmp_path, pool="g3", pool_catalog=str(catalog), overrides=overrides))
    assert "pools.g3: its 3 GPUs (1 node(s) x 3) do not divide into the recipe's 4 " in str(err.value)
    assert "\n" not in str(err.value)
    grid = _load(tmp_path, pool="g4", pool_catalog=str(catalog), overrides=overrides)
    (trial,) = expand(grid)
    config, pools = grid.trial_config(trial), grid.pools.pools
    assert refusal(MilesTrainer, config.updated(pool=pools["g4"]), "checkpoint",
                   checkpoint=tmp_path, others=tuple(pools.values())) is None
    assert "do not divide" in refusal(MilesTrainer, config.updated(pool=pools["g3"]),
                                      "checkpoint", checkpoint=tmp_path)
