"""Grid vocabulary -> verl 0.9.1 Hydra overrides: corrections, engine flags, recipe leaves.

Pure functions, no verl/torch/hydra import, so ``ablate plan`` stays fast. Facts come from
``research/verl-0.9.1.md`` (keys, defaults, the bypass wiring of section 1e, SGLang kwargs of
section 3, the seed-42 group-diversity trap of section 4) and ``research/corrections.md``.

Two rules hold throughout: what verl cannot express is refused with the reason and the nearest
verl setting (never silently changed), and every value reaches Hydra through :func:`hydra_value`,
so a grid value is data, never override syntax.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from orchestrator.corrections import CorrectionSpec, parse_lo_hi, rejection_rules
from orchestrator.engine import RolloutSpec
from orchestrator.pools import COMPUTE_CAPABILITY, PoolSpec
from orchestrator.recipes import flatten

RC = "algorithm.rollout_correction"
ACTOR_LOSS = "actor_rollout_ref.actor.policy_loss"
ROLLOUT = "actor_rollout_ref.rollout"

# Keys the backend sets from the trial, the pool and the vocabularies; a recipe must not set them.
OWNED_PREFIXES = (
    "algorithm.rollout_correction.",
    "actor_rollout_ref.actor.policy_loss.",
    "actor_rollout_ref.rollout.engine_kwargs.",
)
OWNED_KEYS = frozenset({
    "trainer.project_name", "trainer.experiment_name", "trainer.logger",
    "trainer.total_training_steps", "trainer.total_epochs", "trainer.n_gpus_per_node",
    "trainer.default_local_dir", "trainer.resume_mode", "trainer.resume_from_path",
    "data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.fsdp_config.seed",
    "actor_rollout_ref.ref.fsdp_config.seed", "actor_rollout_ref.actor.data_loader_seed",
})  # fmt: skip
# Besides OWNED_KEYS, what the trainer sets per trial from the pool and the grid's checkpoint
# cadence: a pool may not set these either (its overrides are applied after the trial's keys).
POOL_OWNED_KEYS = frozenset({"trainer.nnodes", "trainer.save_freq"})
# A pool override key: a dotted verl key, optionally with Hydra's '+' (add) or '++' (force);
# Hydra's other key syntax (``~key`` deletes, ``key@pkg``, list indices) is not passed through.
POOL_KEY = re.compile(r"\+{0,2}[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Environment variables the trainer sets for every job (``VerlTrainer.environment``): a pool's
# ``verl_env`` may not set them (one would point verl's logger or MLflow run elsewhere).
OWNED_ENV = frozenset({"VERL_FILE_LOGGER_PATH", "PYTHONUNBUFFERED", "ABLATE_TRIAL_ID",
                       "RAY_USAGE_STATS_ENABLED", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"})
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Recipe paths that verl opens on the workers: relative ones are resolved against the repo.
PATH_KEYS = ("function_tool_path", "tool_config_path")
# Recipe sections that are not verl keys: the vocabularies, ``assets`` (model, tokenizer and
# data built in code, orchestrator/verl/cpu/assets.py), which become verl paths, and ``eval``
# (the grid's ``eval: {reference: ...}``, which the runner acts on: orchestrator/evaluation.py;
# verl 0.9.1's config has no top-level ``eval``, its validation is ``trainer.test_freq``).
SECTIONS = ("correction", "rollout", "learner", "assets", "eval")

VERL_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}



# --------------------------------------------------------------------------- Hydra values

_QUOTE_RUN = re.compile(r"(\\+)(?='|\$\{|$)")


def hydra_value(value: Any) -> str:
    """A Hydra override value that parses back to exactly ``value``.

    Strings are always single-quoted: inside quotes ``,``, ``=``, ``~``, ``+``, ``[``, spaces,
    ``$(...)`` and newlines are plain characters. Three things still need escaping (Hydra's
    quoted-string grammar, checked by tests/verl/test_trainer.py against verl's config): a
    quote, backslashes right before a quote / ``${`` / the end, and ``${``. Values containing
    ``${`` are refused anyway (:func:`unsafe_text`): verl re-resolves its config in place.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        problem = unsafe_text(value)
        if problem:
            raise ValueError(problem)
        text = _QUOTE_RUN.sub(lambda m: m.group(1) * 2, value)
        text = text.replace("'", "\\'").replace("${", "\\${")
        return f"'{text}'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_dict_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot pass a {type(value).__name__} to Hydra")


def unsafe_text(value: Any) -> str | None:
    """Why a string inside ``value`` cannot reach verl inertly, or None.

    verl's ``main_ppo`` calls ``OmegaConf.resolve(config)`` in place, which turns an escaped
    ``\\${...}`` back into a live interpolation (``${oc.env:SECRET}`` would read the job's
    environment into the config and MLflow), and argv cannot carry a NUL byte.
    """
    if isinstance(value, str):
        if "${" in value:
            return f"{value[:60]!r} contains '${{', which verl would resolve as an interpolation"
        if "\x00" in value:
            return f"{value[:60]!r} contains a NUL byte"
        return None
    if isinstance(value, Mapping):
        value = list(value.keys()) + list(value.values())
    if isinstance(value, (list, tuple)):
        return next((p for p in map(unsafe_text, value) if p), None)
    return None


def _dict_key(key: Any) -> str:
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ValueError(f"dict key {key!r} is not a plain identifier")
    return key


def override(key: str, value: Any) -> str:
    return f"{key}={hydra_value(value)}"


# --------------------------------------------------------------------------- plan-time checks


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _num(x: float) -> str:
    """The shortest text verl's ``float()`` reads back as exactly ``x``: verl then compares with
    the very numbers the simulator uses (1/hi of rs_bounds included)."""
    text = repr(float(x))
    return text.removesuffix(".0")


def _lo_hi(lo: float, hi: float) -> str:
    return f"{_num(lo)}_{_num(hi)}"


def verl_denominator(c: CorrectionSpec) -> str:
    """The token-mean denominator verl 0.9.1 gives a correction that rejects tokens.

    Decoupled: the trainer writes the helper's mask into ``response_mask`` before the update and
    the engine counts that mask (``batch_num_tokens``): the surviving tokens, ``renormalized``.
    Bypass: the actor's loss runs the helper itself, after the engine counted the mini-batch's
    response tokens, and divides by that count: ``original`` (``core_algos.agg_loss``).
    """
    return "original" if c.policy == "bypass" else "renormalized"


def check_correction(c: CorrectionSpec) -> str | None:
    """Why verl 0.9.1 cannot run this correction (with the nearest verl setting), or None."""
    refused = correction_refusal(c)
    return None if refused is None else refused[1]


def correction_refusal(c: CorrectionSpec) -> tuple[str, str] | None:
    """(rule, reason) of the first refusal rule ``c`` hits, or None if verl 0.9.1 computes what
    the simulator computes. Rules: geometric_is, clip_mode, veto, opsm, routing_replay,
    denominator, duplicate_option (tests/backends/test_correction_parity.py shows, spec by spec,
    that verl cannot express each refused correction or computes something else)."""
    if c.is_level == "geometric":
        return "geometric_is", (
            "verl 0.9.1 has no geometric IS weights (rollout_is takes token|sequence); nearest: "
            "correction.rs: geometric (rejection by geometric-mean ratio, verl seq_mean_k1) or "
            "correction.is_level: sequence")
    if c.is_level != "none" and c.is_mode == "clip":
        return "clip_mode", (
            f"verl truncates IS weights from above only (no lower clamp at {_fmt(c.is_lo)}); "
            "nearest: correction.is_mode: truncate (clamp above at the upper bound) or mask "
            "(IcePop band: weights outside the bounds set to 0)")
    if c.veto is not None:
        k2 = 0.5 * math.log(c.veto) ** 2
        return "veto", (
            f"verl 0.9.1 removed the per-token veto (PR #4544); nearest: correction.rs_filters: "
            f"{{seq_max_k2: {_fmt(k2)}}} rejects a sequence if any token has |log ratio| > "
            f"{_fmt(-math.log(c.veto))} (symmetric, while the veto only looked at low ratios)")
    if c.opsm is not None:
        return "opsm", (
            "verl 0.9.1 has no off-policy sequence masking (OPSM, DeepSeek-V3.2); nearest: "
            "correction.rs: geometric (verl seq_mean_k1 rejects sequences by mean log-ratio, "
            "whatever the advantage sign)")
    if c.routing_replay != "off":
        return "routing_replay", (
            f"routing replay {c.routing_replay} needs a MoE model on verl's Megatron actor "
            "(actor.router_replay); these verl recipes are dense FSDP models; fix: "
            "correction.routing_replay: off")
    if c.rs != "off":
        option = rejection_rules(c)[0][0]
        if option in c.rs_filters:
            return "duplicate_option", (
                f"correction.rs: {c.rs} is verl's {option}, which rs_filters also sets, and verl "
                "takes each option once; fix: keep one of them")
    rejects = c.rs != "off" or bool(c.rs_filters)
    if rejects and c.denominator != verl_denominator(c):
        if c.policy == "bypass":
            return "denominator", (
                "correction.denominator: renormalized with policy: bypass and rejection (rs / "
                "rs_filters): verl's bypass loss rejects tokens after the engine has counted the "
                "mini-batch's tokens and divides by that count, so rejected tokens stay in the "
                "denominator (it cannot renormalise); fix: correction.denominator: original "
                "(what verl computes), or correction.policy: decoupled")
        return "denominator", (
            "correction.denominator: original with rejection (rs / rs_filters): verl rewrites "
            "response_mask after rejection sampling, so the token-mean denominator counts "
            "surviving tokens only (no option keeps the original one); fix: "
            "correction.denominator: renormalized, or replace RS by correction.is_mode: mask "
            "(IcePop zeroes weights and keeps tokens in the mean)")
    return None


def check_rollout(r: RolloutSpec, pool: PoolSpec) -> str | None:
    """Why verl 0.9.1 cannot run these engine flags on ``pool`` whatever the engine, or None.

    What each engine can express is checked against its table (``engines.check_engine``)
    once the engine is known (``rollout.engine`` or the recipe's); here: the CPU engine of cpu
    pools and what the pool's hardware cannot do.
    """
    if pool.kind == "cpu":
        return check_cpu_rollout(r, pool)
    cc = COMPUTE_CAPABILITY.get(pool.accelerator)
    if r.attention_backend == "fa3" and cc is not None and cc < 9.0:
        return (f"FlashAttention-3 needs Hopper (compute capability 9.0); pool {pool.name!r} has "
                f"{pool.accelerator} ({cc}); fix: rollout.attention_backend: flashinfer or triton")
    if "fp8" in (r.dtype, r.kv_cache_dtype) and cc is not None and cc < 8.9:
        return (f"FP8 needs compute capability >= 8.9; pool {pool.name!r} has {pool.accelerator} "
                f"({cc}), where the engine would fall back to a different kernel path; fix: "
                "exclude fp8 on this pool")
    return None


def check_pool(pool: PoolSpec) -> str | None:
    if pool.kind not in ("gpu", "cpu") or pool.gpus_per_node < 1:
        return (f"pool {pool.name!r} has no GPUs (kind {pool.kind}); verl runs on gpu pools "
                "(verl + SGLang) and cpu pools (verl on this CPU); sim-* pools belong to "
                "backend: sim")
    return None


# Engine flags the CPU rollout engine (orchestrator/verl/cpu) honours; the rest are
# SGLang/GPU flags it has no counterpart for.
CPU_ROLLOUT_DTYPES = ("fp32", "bf16")


def check_cpu_rollout(r: RolloutSpec, pool: PoolSpec) -> str | None:
    """Why the CPU rollout engine cannot run these engine flags on cpu pool ``pool``, or None."""
    if r.dtype is not None and r.dtype not in CPU_ROLLOUT_DTYPES:
        return (f"rollout.dtype: {r.dtype} on cpu pool {pool.name!r}: the CPU rollout engine "
                f"computes in {' or '.join(CPU_ROLLOUT_DTYPES)}; fix: one of those, or a gpu pool")
    gpu_only = [f"rollout.{k}: {v}" for k, v in r.requested().items()
                if k not in ("dtype", "temperature") and (k, v) != ("engine", "cpu")]
    if gpu_only:
        return (f"{', '.join(gpu_only)} is a GPU engine (SGLang/vLLM) flag, and cpu pool "
                f"{pool.name!r} runs the CPU rollout engine, which has no such switch; fix: "
                "drop it for cpu pools (exclude it) or use a gpu pool")
    return None


# --------------------------------------------------------------------------- mapping


def correction_overrides(c: CorrectionSpec) -> list[str]:
    """The rollout-correction overrides (decoupled or bypass), all seven keys explicit."""
    settings = correction_settings(c)
    out = [override(f"{RC}.{k}", v) for k, v in settings.items()]
    if c.policy == "bypass":
        # verl 0.9.1's V1 trainer only copies rollout log-probs in bypass mode; the actor's loss
        # must be switched and given the settings itself, or they are silently ignored (1e).
        out.append(override(f"{ACTOR_LOSS}.loss_mode", "bypass_mode"))
        out += [override(f"+{ACTOR_LOSS}.rollout_correction.{k}", v) for k, v in settings.items()]
    return out


def correction_settings(c: CorrectionSpec) -> dict[str, Any]:
    """The seven ``algorithm.rollout_correction`` values for ``c`` (call check first)."""
    rollout_is = None if c.is_level == "none" else c.is_level
    if rollout_is is None:
        threshold: Any = 2.0  # verl's default; unused without IS
    elif c.is_mode == "mask":
        threshold = _lo_hi(c.is_lo, c.is_hi)  # IcePop band on pi_train / pi_rollout
    else:
        threshold = float(c.is_hi)  # TIS: clamp above
    options: list[str] = []
    thresholds: list[str] = []
    for opt, thr in rejection_rules(c):  # rs first (bounds in verl's k1 direction), filters
        options.append(opt)
        thresholds.append(_lo_hi(*parse_lo_hi(thr)) if opt.endswith("_k1") else _num(float(thr)))
    return {
        "rollout_is": rollout_is,
        "rollout_is_threshold": threshold,
        "rollout_is_batch_normalize": bool(c.batch_norm and rollout_is is not None),
        "rollout_rs": ",".join(options) if options else None,
        "rollout_rs_threshold": ",".join(thresholds) if thresholds else None,
        "bypass_mode": c.policy == "bypass",
        "loss_type": c.loss_type,
    }


def recipe_leaves(config: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every verl leaf of a resolved recipe (vocabulary sections skipped)."""
    yield from flatten({k: v for k, v in config.items() if k not in SECTIONS})


def owned(key: str) -> bool:
    return key in OWNED_KEYS or key.startswith(OWNED_PREFIXES)


def pool_settings_problem(pool: PoolSpec) -> tuple[str, str] | None:
    """A pool's ``verl_overrides`` or ``verl_env`` that would replace what the trainer sets
    for every trial, or is not a plain key / variable: (the pool key, the reason), or None.
    Without it a catalogue could give every seed the same data order (``data.seed``), replace
    ``steps`` (``trainer.total_training_steps``) or put trials in one checkpoint folder."""
    for key, value in pool.verl_overrides.items():
        bare = key.lstrip("+")
        if not POOL_KEY.fullmatch(key):
            return "verl_overrides", (
                f"pool {pool.name}: verl_overrides key {key!r} is not a dotted verl key; fix: "
                "write it as in a recipe (letters, digits and '_' between dots, '+' or '++' "
                "first to add a key)")
        if owned(bare) or bare in POOL_OWNED_KEYS:
            return "verl_overrides", (
                f"pool {pool.name}: verl_overrides.{key}: the verl trainer sets {bare} for every "
                "trial (from the grid's steps, seeds, checkpoint and correction keys, and the "
                "pool's size); fix: drop it from the pool")
        problem = unsafe_text(value)
        if problem:
            return "verl_overrides", f"pool {pool.name}: verl_overrides.{key}: {problem}"
    for name, value in pool.verl_env.items():
        if not ENV_NAME.fullmatch(name):
            return "verl_env", (f"pool {pool.name}: verl_env name {name!r} is not an "
                                "environment variable name; fix: letters, digits and '_'")
        if name in OWNED_ENV:
            return "verl_env", (f"pool {pool.name}: verl_env.{name}: the verl trainer sets it for "
                                "every job (its metrics file, MLflow run and logging); fix: drop it")
        if isinstance(value, str) and "\x00" in value:
            return "verl_env", f"pool {pool.name}: verl_env.{name}: its value contains a NUL byte"
    return None
