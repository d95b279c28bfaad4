"""Miles accepts what the miles backend sends it, checked by Miles' own argument parser.

A grid on ``recipes/miles/qwen3_4b_dapo`` with one trial per correction route (no correction,
bypass, Miles' built-in TIS and IcePop, its MIS function at each level, RS, veto, batch
normalisation, OPSM, routing replay), per SGLang flag value of ``orchestrator/miles/flags.py``
and per learner setting (precision, clip ratios, loss aggregation, GSPO, determinism, the
true-on-policy preset) is planned here; one subprocess in the Miles environment (``ablate
gpu-env miles``: ``miles-rl`` 0.0.2) runs Miles' ``parse_args`` (Megatron's parser, Miles'
``miles_validate_args``, its SGLang server arguments, ``hf_validate_args`` against a Qwen3-4B
``config.json`` written here: a config file, no weights) on each trial's arguments and returns
what Miles parsed: every flag must land as the attribute the backend meant, and a true-on-policy
trial's arguments and environment must hold everything Miles' own launch plan
(``build_true_on_policy_launch_plan`` of the parsed arguments) asks for.

Not checked here: Miles' MIS function itself (``examples/``, not in the wheel: a checkout's) reads
the generated ``mis.yaml`` keys (the keys are the ones its shipped ``mis.yaml`` has,
``tests/miles/test_miles_flags.py``); anything that needs a GPU (SGLang and Megatron start-up,
training). Every trial of every committed Miles grid goes through the same parser, once per
distinct argument list. Skipped with the setup command when the environment is absent; in CI
(``.ci/run`` builds it in the background) it waits for the build. Cost: the plans (~3 s) and one
subprocess (imports ~10 s, then ~0.2 s a case).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from doubles import refusal
from gpu_envs import wait_for_ci_build

from orchestrator.backends import trainers_of
from orchestrator.grid import expand, load_grid
from orchestrator.miles import flags
from orchestrator.miles.trainer import MilesTrainer
from orchestrator.pools import COMPUTE_CAPABILITY
from orchestrator.verl import gpu_setup

PROBE = Path(__file__).with_name("miles_parser_probe.py")
REPO = Path(__file__).resolve().parents[2]
# Qwen3-4B's Hugging Face config as far as hf_validate_args compares it (the model arguments of
# the recipe are Miles' scripts/models/qwen3-4B.py; these are the same numbers).
QWEN3_4B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
            "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16"}

# name -> (the trial's settings, {Miles attribute: the value it must parse to}).
CASES: dict[str, tuple[dict, dict]] = {
    "none": ({}, {"use_tis": False, "get_mismatch_metrics": True,
                  "custom_tis_function_path": flags.MIS_FUNCTION}),
    "bypass": ({"correction.policy": "bypass"},
               {"use_rollout_logprobs": True, "use_tis": False}),
    "tis": ({"correction.is_level": "token"},
            {"use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.0,
             "custom_tis_function_path": None}),
    "cis": ({"correction.is_level": "token", "correction.is_mode": "clip"},
            {"use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.5}),
    "icepop": ({"correction.is_level": "token", "correction.is_mode": "mask",
                "correction.denominator": "original"},
               {"custom_tis_function_path": flags.ICEPOP_FUNCTION, "tis_clip_low": 0.5}),
    "mis-seq-rs": ({"correction.is_level": "sequence", "correction.rs": "token",
                    "correction.rs_bounds": [0.5, 2.0], "correction.veto": 1e-4,
                    "correction.batch_norm": True},
                   {"use_tis": True, "custom_tis_function_path": flags.MIS_FUNCTION}),
    "mis-geo-mask": ({"correction.is_level": "geometric", "correction.is_mode": "mask",
                      "correction.is_bounds": [0.999, 1.001]},
                     {"use_tis": True, "get_mismatch_metrics": True}),
    "opsm-r3": ({"correction.is_level": "token", "correction.opsm": 1e-4,
                 "correction.routing_replay": "R3"},
                {"use_opsm": True, "opsm_delta": 1e-4, "use_rollout_routing_replay": True}),
    "r2": ({"correction.routing_replay": "R2"}, {"use_routing_replay": True}),
    "fp16-clips": ({"learner.precision": "fp16", "learner.loss": "vanilla", "learner.clip_ratio_low": 0.2,
                    "learner.clip_ratio_high": 0.28, "learner.clip_ratio_c": 3.0,
                    "learner.loss_agg_mode": "token-mean"},
                   {"fp16": True, "bf16": False, "eps_clip": 0.2, "eps_clip_high": 0.28,
                    "eps_clip_c": 3.0, "calculate_per_token_loss": True}),
    "gspo": ({"learner.loss": "gspo"}, {"advantage_estimator": "gspo", "bf16": True}),
    "temperature": ({"rollout.temperature": 0.7}, {"rollout_temperature": 0.7}),
    "true-on-policy": ({"learner.preset": "true_on_policy"},
                       {"true_on_policy_mode": True,
                        "sglang_enable_deterministic_inference": True}),
}
# One case per SGLang flag value Miles maps (flags.SGLANG), each parsed to its server argument.
for _flag, (_option, _values) in flags.SGLANG.items():
    _dest = "sglang_" + _option.removeprefix("--sglang-").replace("-", "_")
    _domain = list(_values) if _values is not None else {
        "attention_backend": ["fa3", "triton"], "max_num_seqs": [64]}[_flag]
    for _value in _domain:
        _mapped = None if _values is None else _values[_value]
        _expect = {
            "lm_head_fp32": True, "deterministic": True, "prefix_caching": True,
            "cudagraph_mode": True}.get(_flag, _mapped if _mapped is not None else _value)
        if _flag == "chunked_prefill":
            _expect = -1
        CASES[f"sglang-{_flag}-{_value}"] = ({f"rollout.{_flag}": _value}, {_dest: _expect})
# The settings the deterministic-inference flag of true-on-policy would clash with are off.
CASES["sglang-deterministic-True"][0]["rollout.attention_backend"] = "fa3"


def _grid(tmp: Path) -> Path:
    checkpoint = tmp / "Qwen3-4B-Base"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(QWEN3_4B))
    (tmp / "torch_dist").mkdir()  # Miles checks that --ref-load exists (an empty folder here)
    for name in ("train.jsonl", "aime.jsonl"):
        (tmp / name).write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    grid = {"name": "miles-parser", "recipe": "miles/qwen3_4b_dapo", "backend": "miles",
            "steps": 10, "pool": "h100", "overrides": {
                "miles.hf_checkpoint": str(checkpoint), "miles.ref_load": str(tmp / "torch_dist"),
                "miles.prompt_data": str(tmp / "train.jsonl"),
                "miles.eval_prompt_data": ["aime", str(tmp / "aime.jsonl")]},
            "axes": {"case": {name: settings for name, (settings, _) in CASES.items()}}}
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def _case(tmp: Path, trial, config) -> dict:
    mis_path = tmp / f"{trial.trial_id}-mis.yaml"
    argv, mis, env = MilesTrainer.arguments(trial, config, mis_path=str(mis_path))
    if mis is not None:
        mis_path.write_text(yaml.safe_dump(mis))
    major, minor = divmod(round(COMPUTE_CAPABILITY.get(config.pool.accelerator, 9.0) * 10), 10)
    return {"argv": argv, "env": env, "capability": [major, minor], "mis": mis}


def _arguments(tmp: Path) -> dict[str, dict]:
    grid = load_grid(_grid(tmp))
    return {dict(t.axes)["case"]: _case(tmp, t, grid.trial_config(t)) for t in expand(grid)}


def committed_miles_grids() -> list[tuple[str, str | None]]:
    """Every committed grid a Miles trainer runs: by its ``backend:``, or (``--backend miles``)
    by a ``recipe:`` that names one for Miles (``grids/seed_study.yaml``)."""
    out = []
    for path in sorted((REPO / "grids").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "miles" in trainers_of(raw.get("backend", "sim")):
            out.append((str(path.relative_to(REPO)), None))
        elif isinstance(raw.get("recipe"), dict) and "miles" in raw["recipe"]:
            out.append((str(path.relative_to(REPO)), "miles"))
    return out


def _committed(tmp: Path) -> dict[str, dict]:
    """One case per distinct argument list of every trial of the committed Miles grids (a trial
    differs from another of its cell only by its id in the paths), on its pool's GPU; the model
    and data paths point at the files ``_grid`` wrote."""
    paths = {"miles.hf_checkpoint": str(tmp / "Qwen3-4B-Base"),
             "miles.ref_load": str(tmp / "torch_dist"),
             "miles.prompt_data": str(tmp / "train.jsonl"),
             "miles.eval_prompt_data": ["aime", str(tmp / "aime.jsonl")]}
    out: dict[str, dict] = {}
    seen: set[str] = set()
    for path, backend in committed_miles_grids():
        grid = load_grid(REPO / path, backend=backend)
        for trial in expand(grid):
            case = _case(tmp, trial, grid.trial_config(trial).updated(paths))
            shape = json.dumps([[a for a in case["argv"] if trial.trial_id not in a],
                                case["env"], case["capability"], case["mis"]], default=str)
            if shape not in seen:
                seen.add(shape)
                out[f"{path}:{trial.trial_id}"] = case
    return out


GPU_COUNTS = range(1, 9)


def _world_sizes(base: dict) -> dict[str, dict]:
    """A trial's arguments with 1..8 GPUs on its node (the recipe's tensor parallel 2)."""
    out = {}
    at = base["argv"].index("--actor-num-gpus-per-node") + 1
    for n in GPU_COUNTS:
        argv = list(base["argv"])
        argv[at] = str(n)
        out[f"gpus-{n}"] = {**base, "argv": argv}
    return out


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    wait_for_ci_build("miles")
    env = gpu_setup.env_dir("miles")
    python = env / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no Miles environment at {env}; make it with: ablate gpu-env miles")
    tmp = tmp_path_factory.mktemp("miles")
    cases = _arguments(tmp)
    assert set(cases) == set(CASES)
    cases.update(_committed(tmp))
    cases.update(_world_sizes(cases[min(CASES)]))
    attrs = sorted({a for _, expect in CASES.values() for a in expect})
    done = subprocess.run([str(python), str(PROBE)], input=json.dumps(
        {"cases": cases, "attrs": attrs}), capture_output=True, text=True, timeout=600,
        cwd=tmp, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    return {"argv": cases, **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("name", sorted(CASES))
def test_miles_parses_each_trial_as_the_backend_meant(parsed, name) -> None:
    result = parsed["cases"][name]
    assert "error" not in result, result.get("error")
    expected = CASES[name][1]
    got = {k: result["attrs"][k] for k in expected}
    assert got == expected


def test_miles_parses_every_trial_of_the_committed_miles_grids(parsed) -> None:
    """``grids/miles_mis.yaml`` and ``grids/seed_study.yaml --backend miles``: each distinct
    argument list, as Miles parses it on its pool's GPU."""
    grids = {p for p, _ in committed_miles_grids()}
    assert {"grids/miles_mis.yaml", "grids/seed_study.yaml"} <= grids
    ran = {k: v for k, v in parsed["cases"].items() if k.partition(":")[0] in grids}
    assert {k.partition(":")[0] for k in ran} == grids
    refused = {k: v["error"][:300] for k, v in ran.items() if "error" in v}
    assert refused == {}


def test_true_on_policy_holds_miles_own_launch_plan(parsed) -> None:
    """Every argument and variable Miles' launch plan derives for the parsed trial is in what
    the backend sends, so the run is the plan's; and the plan's model list is the backend's."""
    result = parsed["cases"]["true-on-policy"]
    sent = parsed["argv"]["true-on-policy"]
    assert result["plan_args"], "Miles' plan was not enabled for the true-on-policy trial"
    assert [a for a in result["plan_args"] if a not in sent["argv"]] == []
    assert {k: sent["env"].get(k) for k in result["plan_env"]} == result["plan_env"]
    assert tuple(parsed["true_on_policy_models"]) == tuple(sorted(flags.TRUE_ON_POLICY_MODELS))


def test_miles_refuses_a_pool_exactly_where_the_backend_does(parsed, tmp_path) -> None:
    """The backend's plan-time world-size check (MilesTrainer.problems' config stage) against Megatron's
    own assert as Miles parses the job, for 1..8 GPUs on a node."""
    grid = load_grid(_grid(tmp_path))
    trial = next(t for t in expand(grid) if dict(t.axes)["case"] == min(CASES))
    config = grid.trial_config(trial)
    ours, theirs = {}, {}
    for n in GPU_COUNTS:
        pool = config.pool.model_copy(update={"gpus_per_node": n})
        ours[n] = refusal(MilesTrainer, config.updated(pool=pool), "config") is not None
        error = parsed["cases"][f"gpus-{n}"].get("error", "")
        theirs[n] = "is not divisible by total_model_size" in error
        assert not error or theirs[n], error[:300]  # no other refusal
    assert ours == theirs and sum(theirs.values()) == 4, (ours, theirs)
