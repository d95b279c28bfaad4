"""What a trial's ``correction.*``, ``rollout.*`` and ``learner.*`` settings become on Miles'
command line (``train.py`` arguments) and in its MIS config, or why Miles cannot run them.

Read in the ``miles-rl`` 0.0.2 wheel (radixark/miles; the environment ``ablate gpu-env miles``
makes, ``orchestrator/miles/lock.txt``), and checked by Miles' own ``parse_args`` and
``build_true_on_policy_launch_plan`` in ``tests/miles/test_miles_parser.py``:

* built-in corrections (``miles/backends/training_utils/loss.py``): ``--use-tis`` with no custom
  function runs ``vanilla_tis_function`` (462-480: ``w = clamp(rho, tis_clip_low, tis_clip)``,
  masks unchanged), the custom function ``icepop_function`` (539-) zeroes weights outside
  ``[tis_clip_low, tis_clip]``, masks unchanged (the rejected tokens stay in the denominator);
* everything else is Miles' MIS function (``examples/infra_features/train_infer_mismatch_helper/
  mis.py``, not in the wheel: a Miles checkout's, which the pool names), configured by a
  per-trial ``mis.yaml`` (``--custom-config-path``; its keys become ``args.*``);
* a custom function that changes the masks changes the denominator too: loss.py:733-742 rebuilds
  the reducer from the returned masks and ``cp_utils.get_sum_of_sample_mean`` (92-113) divides
  by their sum, so RS (and MIS's mask mode) run with ``denominator: renormalized`` only;
* ``--use-rollout-logprobs`` (bypass) excludes ``--use-tis`` (arguments.py:2033-2034);
  ``--get-mismatch-metrics`` needs a custom function (2036-2039).

Plain data and pure functions: nothing here imports Miles (plan time stays fast).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.learner import LearnerSpec

MIS_FUNCTION = "examples.infra_features.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
MIS_FILE = "examples/infra_features/train_infer_mismatch_helper/mis.py"
ICEPOP_FUNCTION = "miles.backends.training_utils.loss.icepop_function"

# rollout.* -> (SGLang server argument, as Miles prefixes it, value map); Miles passes every
# SGLang ServerArgs option as --sglang-<option> (miles/backends/sglang_utils/arguments.py:37-).
SGLANG: dict[str, tuple[str, Mapping[Any, Any] | None]] = {
    "dtype": ("--sglang-dtype", {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}),
    "kv_cache_dtype": ("--sglang-kv-cache-dtype", {"fp8": "fp8_e4m3", "bf16": "bfloat16"}),
    "lm_head_fp32": ("--sglang-enable-fp32-lm-head", {True: None}),
    "deterministic": ("--sglang-enable-deterministic-inference", {True: None}),
    "attention_backend": ("--sglang-attention-backend", None),
    "chunked_prefill": ("--sglang-chunked-prefill-size", {False: -1}),
    "prefix_caching": ("--sglang-disable-radix-cache", {False: None}),
    "cudagraph_mode": ("--sglang-disable-cuda-graph", {"none": None}),
    "max_num_seqs": ("--sglang-max-running-requests", None),
}
# rollout.* that need no engine flag: Miles' own sampling arguments (arguments.py:304-313).
SAMPLING = {"temperature": "--rollout-temperature"}
# The rollout keys that say nothing to an engine (they travel with the trial's record).
NOT_ENGINE = frozenset({"engine", "provenance"})

# Miles' true-on-policy launch plan (miles/true_on_policy/: config.py 98-126 and 195-235,
# contracts.py, schema.py 26-34, model_profiles.py 56-79), for the Megatron backend: the model
# names its only profile (qwen3_dense) accepts, its contract and SGLang attention backend.
TRUE_ON_POLICY_MODELS = ("Qwen3-0.6B", "Qwen3-4B", "Qwen3-4B-Base", "Qwen3-4B-Instruct-2507")
TRUE_ON_POLICY_CONTRACT = "qwen3_dense_true_on_policy_v1"
TRUE_ON_POLICY_ATTENTION = "fa3"
TRUE_ON_POLICY_ENV = {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
                      "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

# What every Miles job's processes start with: Megatron's validate_args asserts
# CUDA_DEVICE_MAX_CONNECTIONS=1 under tensor or context parallelism before Blackwell
# (megatron/training/arguments.py:925-940), and Miles' example sets it for its Ray job
# (run-qwen3-4b-mis.sh's runtime env); PYTHONUNBUFFERED: logs as they are written.
JOB_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}

PRECISION = {"bf16": "--bf16", "fp16": "--fp16"}
LOSS_AGG = {"token-mean": ("--calculate-per-token-loss",), "seq-mean-token-mean": ()}


def _lower(bounds: tuple[float | None, float]) -> float:
    low, high = bounds
    return 1.0 / high if low is None else low


def needs_mis(c: CorrectionSpec) -> bool:
    """Whether the correction needs Miles' MIS function (a Miles checkout) rather than a
    built-in one: anything but token-level IS with no RS, veto or batch normalisation."""
    if c.policy == "bypass":
        return True  # the metrics only (use_tis: false); bypass excludes --use-tis
    if c.is_level == "none":
        return True  # metrics only: --get-mismatch-metrics needs a custom function
    return c.is_level != "token" or c.rs != "off" or c.veto is not None or c.batch_norm


def correction_problem(c: CorrectionSpec) -> str | None:
    """Why Miles 0.0.2 cannot run correction ``c`` (one line, naming the nearest setting)."""
    if c.rs_filters:
        return ("correction.rs_filters: Miles' MIS has no divergence filters (verl's k2/k3 "
                "options); fix: use correction.rs with rs_bounds")
    if c.loss_type != "ppo_clip":
        return (f"correction.loss_type: {c.loss_type}: Miles weights its PPO-clip loss "
                "(loss.py:702-742); fix: use ppo_clip")
    if c.policy == "bypass" and (c.is_level != "none" or c.rs != "off" or c.veto is not None
                                 or c.batch_norm):
        return ("correction.policy: bypass: Miles' --use-rollout-logprobs excludes --use-tis "
                "(miles/utils/arguments.py:2033-2034); fix: use policy decoupled for IS/RS")
    if c.is_level == "none" and (c.rs != "off" or c.veto is not None):
        return ("correction.rs: Miles' MIS rejects (and vetoes) only inside its IS path "
                "(use_tis); fix: set correction.is_level, or rs: off")
    if c.veto is not None and c.rs == "off":
        return ("correction.veto: Miles' MIS applies the veto only with rejection sampling "
                "(use_rs); fix: set correction.rs, or drop the veto")
    if c.batch_norm and c.is_level == "geometric":
        return ("correction.batch_norm: Miles' MIS raises ValueError for geometric-level batch "
                "normalisation; fix: use is_level token or sequence")
    masks_change = c.rs != "off" or (c.is_mode == "mask" and needs_mis(c))
    if masks_change and c.denominator == "original":
        return ("correction.denominator: original: Miles rebuilds its loss reducer from the "
                "masks a correction returns (loss.py:733-742; cp_utils.py:92-113 divides by "
                "their sum), so RS and MIS masking renormalise; fix: denominator renormalized"
                + ("" if c.rs != "off" else ", or token-level mask mode alone (IcePop)"))
    if (c.is_level == "token" and c.is_mode == "mask" and not needs_mis(c)
            and c.denominator == "renormalized"):
        return ("correction.denominator: renormalized: Miles' IcePop (loss.py:539-) zeroes "
                "weights and keeps the masks, so its rejected tokens stay in the denominator; "
                "fix: denominator original (or add correction.rs for MIS masking)")
    return None


def mis_config(c: CorrectionSpec) -> dict[str, Any] | None:
    """The trial's ``mis.yaml`` (Miles' MIS keys), or None where a built-in function runs."""
    if not needs_mis(c):
        return None
    use_tis = c.is_level != "none" and c.policy != "bypass"
    rs_on = c.rs != "off"
    config: dict[str, Any] = {
        "use_tis": use_tis,
        "use_rs": rs_on,
        "tis_level": c.is_level if c.is_level != "none" else "token",
        "rs_level": c.rs if rs_on else "token",
        "tis_mode": c.is_mode,
        "tis_lower_bound": _lower(c.is_bounds),
        "tis_upper_bound": c.is_bounds[1],
        "rs_lower_bound": None if c.rs_bounds is None else _lower(c.rs_bounds),
        "rs_upper_bound": None if c.rs_bounds is None else c.rs_bounds[1],
        # MIS vetoes only with use_rs; 0 turns it off (no ratio is below 0).
        "rs_veto_threshold": c.veto if c.veto is not None else 0.0,
        "tis_batch_normalize": c.batch_norm,
    }
    return config


def correction_flags(c: CorrectionSpec, mis_path: str | None) -> list[str]:
    """Miles arguments of correction ``c`` (``mis_path``: where the trial's ``mis.yaml`` is)."""
    out: list[str] = []
    if c.policy == "bypass":
        out.append("--use-rollout-logprobs")
    if c.opsm is not None:
        out += ["--use-opsm", "--opsm-delta", number(c.opsm)]
    if c.routing_replay == "R2":
        out.append("--use-routing-replay")
    elif c.routing_replay == "R3":
        out.append("--use-rollout-routing-replay")
    if needs_mis(c):
        if mis_path is None:
            raise ValueError("a MIS correction needs the path of its mis.yaml")
        if c.is_level != "none" and c.policy != "bypass":
            out.append("--use-tis")
        return out + ["--get-mismatch-metrics", "--custom-config-path", mis_path,
                      "--custom-tis-function-path", MIS_FUNCTION]
    out += ["--use-tis", "--tis-clip", number(c.is_bounds[1])]
    if c.is_mode == "truncate":
        return out + ["--tis-clip-low", "0"]
    out += ["--tis-clip-low", number(_lower(c.is_bounds))]
    if c.is_mode == "mask":
        out += ["--custom-tis-function-path", ICEPOP_FUNCTION]
    return out


def rollout_problem(r: RolloutSpec) -> str | None:
    """Why Miles' SGLang rollouts cannot take ``rollout.*`` settings ``r``, or None."""
    if r.engine not in (None, "sglang"):
        return (f"rollout.engine: {r.engine}: Miles rolls out with SGLang only (its wheel "
                "bundles it); fix: rollout.engine sglang, or backend verl")
    for key, value in r.model_dump(exclude_none=True).items():
        if key in NOT_ENGINE or key in SAMPLING:
            continue
        if key not in SGLANG:
            return (f"rollout.{key}: Miles has no setting for it (its SGLang flags: "
                    f"{', '.join(sorted(SGLANG))}); fix: drop it or use backend verl")
        _, values = SGLANG[key]
        if values is not None and value not in values:
            return (f"rollout.{key}: {value!r} has no Miles/SGLang spelling (it takes "
                    f"{', '.join(map(str, values))}); fix: drop it")
    return None


def rollout_flags(r: RolloutSpec) -> list[str]:
    out: list[str] = []
    for key, value in r.model_dump(exclude_none=True).items():
        if key in SAMPLING:
            out += [SAMPLING[key], number(value)]
        elif key in SGLANG:
            flag, values = SGLANG[key]
            if values is None:
                out += [flag, str(value)]
            else:
                mapped = values[value]
                out += [flag] if mapped is None else [flag, str(mapped)]
    return out


def learner_problem(learner: LearnerSpec) -> str | None:
    """Why Miles cannot run ``learner.*`` settings ``learner`` (the model aside)."""
    if learner.loss not in (None, "vanilla", "gspo"):
        return (f"learner.loss: {learner.loss}: Miles' advantage estimators give vanilla "
                "GRPO and GSPO only (arguments.py:924-935); fix: drop it or use backend verl")
    if learner.precision == "fp32":
        return ("learner.precision: fp32: Miles trains Megatron in bf16 or fp16 (--bf16, "
                "--fp16); fix: bf16 or fp16")
    if learner.max_staleness is not None:
        return ("learner.max_staleness: Miles' train.py is synchronous (its fully async "
                "driver is train_async.py); fix: drop it")
    return None


def true_on_policy_problem(learner: LearnerSpec, model_name: Any,
                           sequence_parallel: bool) -> str | None:
    """Why Miles' true-on-policy launch plan refuses the recipe's model (``--model-name``)."""
    if learner.preset != "true_on_policy":
        return None
    if model_name not in TRUE_ON_POLICY_MODELS:
        return (f"learner.preset: true_on_policy: Miles' launch plan has a model profile for "
                f"{', '.join(TRUE_ON_POLICY_MODELS)} only, not miles.model_name "
                f"{model_name!r} (miles/true_on_policy/model_profiles.py); fix: drop the preset")
    if sequence_parallel:
        return ("learner.preset: true_on_policy: Miles' plan turns Megatron's sequence "
                "parallelism off for this contract (config.py 270-279); fix: drop "
                "miles.sequence_parallel from the recipe")
    return None


def learner_flags(learner: LearnerSpec) -> tuple[list[str], dict[str, str]]:
    """Miles arguments and job environment of ``learner.*``: precision, clip ratios, loss
    aggregation, determinism, and the true-on-policy launch plan (Megatron backend)."""
    out: list[str] = []
    env: dict[str, str] = dict(JOB_ENV)
    if learner.loss == "gspo":
        out += ["--advantage-estimator", "gspo"]
    out.append(PRECISION[learner.precision or "bf16"])
    for key, flag in (("clip_ratio_low", "--eps-clip"), ("clip_ratio_high", "--eps-clip-high"),
                      ("clip_ratio_c", "--eps-clip-c")):
        value = getattr(learner, key)
        if value is not None:
            out += [flag, number(value)]
    if learner.loss_agg_mode is not None:
        out += list(LOSS_AGG[learner.loss_agg_mode])
    if learner.preset == "true_on_policy":
        out += ["--sglang-enable-deterministic-inference",
                "--sglang-true-on-policy-contract", TRUE_ON_POLICY_CONTRACT,
                "--sglang-attention-backend", TRUE_ON_POLICY_ATTENTION,
                "--true-on-policy-contract", TRUE_ON_POLICY_CONTRACT,
                "--transformer-impl", "local", "--use-cpu-initialization",
                "--batch-invariant-mode", "--no-bias-swiglu-fusion", "--no-rope-fusion",
                "--deterministic-mode", "--true-on-policy-mode",
                "--recompute-logprobs-via-prefill"]
        env.update(TRUE_ON_POLICY_ENV)
    elif learner.deterministic:
        out.append("--deterministic-mode")
    return out, env


def number(value: Any) -> str:
    """A number as Miles' argparse reads it back to the same float."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return repr(value)
    return str(value)
