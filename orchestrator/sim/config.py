"""Turn a trial's resolved recipe dict into the simulator's typed objects, validating first.

Every user mistake (unknown key, bad value, a correction the model cannot run) is raised here,
before any tensor is allocated, as a one-line UserError naming the key and the fix.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.evaluation import REFERENCE_TARGETS
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.learner import LearnerSpec, combination_problem, rollout_for
from orchestrator.pools import PoolSpec
from orchestrator.sim.profile import (
    Numerics,
    check_rollout,
    explain,
    parse_profile,
    resolve_numerics,
)

SECTIONS = ("model", "task", "train", "eval", "sim", "correction", "rollout", "learner")
MODEL_KEYS = ("arch", "d_model", "n_layers", "n_heads", "d_ff", "n_experts", "top_k",
              "expert_d_ff", "aux_loss_coef")
TASK_KEYS = ("name", "digits", "answer", "response_len", "vocab", "max_step", "aliases")
TRAIN_KEYS = ("lr", "prompts_per_step", "group_size", "ppo_epochs", "minibatches", "clip_eps",
              "kl_coef", "grad_clip", "weight_decay", "adam_beta1", "adam_beta2", "threads")
EVAL_KEYS = ("every", "prompts", "reference")  # reference: orchestrator/evaluation.py
SIM_KEYS = ("reproducible",)
TASK_NAMES = ("progression", "sum_mod", "reverse_sum", "reverse")  # == sim.task.TASKS (tested)
# The type every scalar knob must have (checked at plan time too: nothing reaches a trial unless
# it would run). bool is not an int here; an int is a fine float.
_INT, _FLOAT, _BOOL = "an integer", "a number", "true or false"
KNOB_TYPES = {
    **{f"model.{k}": _INT for k in ("d_model", "n_layers", "n_heads", "d_ff", "n_experts", "top_k")},
    "model.aux_loss_coef": _FLOAT,
    **{f"task.{k}": _INT for k in ("digits", "answer", "response_len", "vocab", "max_step")},
    "task.aliases": _BOOL,
    **{f"train.{k}": _INT for k in ("prompts_per_step", "group_size", "ppo_epochs", "minibatches",
                                     "threads")},
    **{f"train.{k}": _FLOAT for k in ("lr", "clip_eps", "kl_coef", "grad_clip", "weight_decay",
                                       "adam_beta1", "adam_beta2")},
    "eval.every": _INT, "eval.prompts": _INT,
    "sim.reproducible": _BOOL,
}


# Ranges (inclusive; None: unbounded) of the knobs whose values outside them plan but cannot
# run, or can never matter: a model without layers, a negative learning rate, evaluation every
# 0 steps. Read at plan time, so ``ablate plan`` refuses them with the key and the range.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "model.d_model": (1, 16_384), "model.n_layers": (1, 256), "model.n_heads": (1, 1024),
    "model.d_ff": (1, 262_144), "model.n_experts": (1, 1024), "model.aux_loss_coef": (0, None),
    "task.digits": (2, 64), "task.answer": (1, 1024), "task.response_len": (2, 4096),
    "task.vocab": (24, 65_536), "task.max_step": (1, 10),  # == sim.task: 14 + 10 digit tokens
    "train.prompts_per_step": (1, 65_536), "train.group_size": (2, 4096),
    "train.ppo_epochs": (1, 1000), "train.kl_coef": (0, None), "train.weight_decay": (0, None),
    "train.adam_beta1": (0, 0.999999), "train.adam_beta2": (0, 0.999999),
    "eval.every": (1, None), "eval.prompts": (1, 65_536),
}
# Knobs that must be strictly positive (a zero learning rate, clip range or gradient clip
# trains nothing or divides by zero).
POSITIVE = ("train.lr", "train.clip_eps", "train.grad_clip")
BYTES_PER_PARAM = 4 * 5  # fp32 weights, gradients, two Adam moments, the rollout engine's copy


def _range_problem(key: str, value: Any) -> str | None:
    if key in POSITIVE and not value > 0:
        return f"must be > 0, got {value!r}"
    lo, hi = RANGES.get(key, (None, None))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        shown = f"be in {lo:g}..{hi:g}" if hi is not None else f"be >= {lo:g}"
        return f"must {shown}, got {value!r}"[:200]
    return None


def machine_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int | None:
    """Physical memory of this machine in bytes, or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def memory_estimate(model: Mapping[str, Any], task: Mapping[str, Any],
                    train: Mapping[str, Any]) -> tuple[int, int]:
    """(parameters, bytes) of a trial's model: weights with their gradients, Adam state and the
    rollout copy, plus the activations one training batch keeps for the backward pass. An
    estimate from the config (``sim.model.init_params`` is the layout), made before any tensor
    exists; the real peak is below it for the recipes in ``recipes/sim``."""
    d, layers = model.get("d_model", 64), model.get("n_layers", 2)
    vocab = task.get("vocab", 32)
    seq = task.get("digits", 3) + 2 + task.get("response_len", 18)
    if model.get("arch", "dense") == "moe":
        experts = model.get("n_experts", 4)
        hidden = model.get("expert_d_ff") or model.get("d_ff", 128)
        ffn = experts * d + 2 * experts * hidden * d
        act_ffn = model.get("top_k", 1) * hidden + experts
    else:
        ffn = 2 * model.get("d_ff", 128) * d
        act_ffn = model.get("d_ff", 128)
    params = 2 * vocab * d + seq * d + layers * (4 * d + 4 * d * d + ffn) + 2 * d
    batch = train.get("prompts_per_step", 16) * train.get("group_size", 8)
    heads = model.get("n_heads", 4)
    activations = 4 * batch * seq * (layers * (12 * d + 2 * act_ffn + heads * seq) + 2 * vocab)
    return params, params * BYTES_PER_PARAM + activations


def _typed(key: str, value: Any) -> bool:
    kind = KNOB_TYPES.get(key)
    if kind is _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is _FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is _BOOL:
        return isinstance(value, bool)
    return True


@dataclasses.dataclass(frozen=True)
class SimSetup:
    """Everything one simulator attempt needs, validated (no torch objects yet)."""

    model: dict[str, Any]
    task: dict[str, Any]
    train: dict[str, Any]
    correction: CorrectionSpec
    rollout: RolloutSpec
    numerics: Numerics
    threads: int
    reproducible: bool = True  # pinned CPU numerics (orchestrator/sim/numerics.py)
    learner: LearnerSpec = dataclasses.field(default_factory=LearnerSpec)


def _section(config: Mapping[str, Any], name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    body = config.get(name) or {}
    if not isinstance(body, Mapping):
        raise UserError(f"{name}: must be a mapping, got {type(body).__name__}")
    for key in body:
        if key not in keys:
            hint = did_you_mean(key, keys)
            raise UserError(f"{name}.{key} is not a simulator setting; allowed: {', '.join(keys)}"
                            + (f"; did you mean {name}.{hint}?" if hint else ""))
    return dict(body)


def _need(cond: bool, key: str, problem: str) -> None:
    if not cond:
        raise UserError(f"{key}: {problem}")


def _spec(model: type, raw: Mapping[str, Any], section: str) -> Any:
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise UserError(explain(exc, section)) from None


def build_setup(config: Mapping[str, Any], pool: PoolSpec) -> SimSetup:
    """Validate ``config`` (recipe + overrides) for ``pool``; raises UserError on any mistake."""
    for key in config:
        if key not in SECTIONS:
            raise UserError(f"{key}: not a section of a sim recipe; allowed: {', '.join(SECTIONS)}")
    model = _section(config, "model", MODEL_KEYS)
    task = _section(config, "task", TASK_KEYS)
    train = _section(config, "train", TRAIN_KEYS)
    ev = _section(config, "eval", EVAL_KEYS)
    sim = _section(config, "sim", SIM_KEYS)
    for name, body in (("model", model), ("task", task), ("train", train), ("eval", ev),
                       ("sim", sim)):
        for key, value in body.items():
            _need(_typed(f"{name}.{key}", value), f"{name}.{key}",
                  f"must be {KNOB_TYPES.get(f'{name}.{key}')}, got {value!r}"[:200])
    for name, body in (("model", model), ("task", task), ("train", train), ("eval", ev)):
        for key, value in body.items():
            if KNOB_TYPES.get(f"{name}.{key}") in (_INT, _FLOAT):
                problem = _range_problem(f"{name}.{key}", value)
                _need(problem is None, f"{name}.{key}", problem or "")
    _need(task.get("name", "progression") in TASK_NAMES, "task.name",
          f"must be one of {', '.join(TASK_NAMES)}, got {task.get('name')!r}"[:200])
    correction = _spec(CorrectionSpec, config.get("correction") or {}, "correction")
    learner = _spec(LearnerSpec, config.get("learner") or {}, "learner")
    rollout = rollout_for(learner, _spec(RolloutSpec, config.get("rollout") or {}, "rollout"))
    _need(pool.kind == "sim", "pool", f"{pool.name} is a {pool.kind} pool; the sim backend "
          "needs a sim-* pool")
    problem = check_learner(learner, correction, rollout) or check_rollout(
        rollout, pool.sim_profile, pool.name)
    if problem:
        raise UserError(problem)
    numerics = resolve_numerics(parse_profile(pool.sim_profile, pool.name), rollout)
    # The trainer is deterministic exactly when its CPU numerics are pinned.
    _need(not learner.is_deterministic or sim.get("reproducible", True) is not False,
          "learner.deterministic", "needs pinned CPU numerics, and sim.reproducible is false; "
          "fix: sim.reproducible: true")

    arch = model.get("arch", "dense")
    _need(arch in ("dense", "moe"), "model.arch", f"must be dense or moe, got {arch!r}")
    d, h = model.get("d_model", 64), model.get("n_heads", 4)
    _need(isinstance(d, int) and isinstance(h, int) and h > 0 and d % h == 0, "model.n_heads",
          f"must divide model.d_model ({d}), got {h}")
    if arch == "moe":
        e, k = model.get("n_experts", 4), model.get("top_k", 1)
        _need(1 <= k <= e, "model.top_k", f"must be in 1..model.n_experts ({e}), got {k}")
        fe = model.get("expert_d_ff")
        _need(fe is None or (isinstance(fe, int) and fe >= 1), "model.expert_d_ff",
              f"must be a positive integer (or null: model.d_ff), got {fe!r}")
    _need(correction.routing_replay == "off" or arch == "moe", "correction.routing_replay",
          f"{correction.routing_replay} replays MoE expert indices; model.arch is dense "
          "(set model.arch: moe or routing_replay: off)")
    p, g = train.get("prompts_per_step", 16), train.get("group_size", 8)
    mb = train.get("minibatches", 4)
    _need(g >= 2, "train.group_size", f"GRPO needs >= 2 samples per prompt, got {g}")
    _need(1 <= mb <= p * g, "train.minibatches", f"must be in 1..{p * g} (the batch), got {mb}")
    answer = task.get("digits", 3) if task.get("name") == "reverse" else task.get("answer", 16)
    _need(task.get("response_len", 18) >= answer + 1, "task.response_len",
          f"must be >= {answer + 1} (the answer and EOS), got {task.get('response_len', 18)}")
    threads = train.pop("threads", 1)
    cpus = machine_cpus()
    _need(isinstance(threads, int) and 1 <= threads <= cpus, "train.threads",
          f"must be in 1..{cpus} (the CPUs this machine gives the process), got {threads}")
    params, need = memory_estimate(model, task, train)
    have = machine_memory()
    _need(have is None or need <= have, "model.d_model",
          f"a model of ~{params:.3g} parameters (d_model {model.get('d_model', 64)}, n_layers "
          f"{model.get('n_layers', 2)}) needs ~{need / 2**30:.3g} GiB to train, more than this "
          f"machine's {(have or 0) / 2**30:.3g} GiB; make it smaller")
    if "aux_loss_coef" in model:
        train["aux_loss_coef"] = model.pop("aux_loss_coef")
    if "every" in ev:
        train["eval_every"] = ev["every"]
    if "prompts" in ev:
        train["eval_prompts"] = ev["prompts"]
    if ev.get("reference") is not None:
        _need(ev["reference"] in REFERENCE_TARGETS, "eval.reference",
              f"must be one of {', '.join(REFERENCE_TARGETS)}, got {ev['reference']!r}"[:200])
        train["eval_reference"] = ev["reference"]
    return SimSetup(model, task, train, correction, rollout, numerics, threads,
                    sim.get("reproducible", True), learner)


def check_learner(learner: LearnerSpec, correction: CorrectionSpec,
                  rollout: RolloutSpec) -> str | None:
    """Why the simulator cannot run these ``learner.*`` settings, or None (``rollout`` is the
    engine flags after :func:`learner.rollout_for`)."""
    problem = combination_problem(learner, correction, rollout)
    if problem:
        return problem
    if learner.max_staleness is not None:
        return (f"learner.max_staleness: {learner.max_staleness} bounds the staleness of an "
                "asynchronous trainer (verl separate_async); the simulator's trainer is "
                "synchronous and models staleness as a fixed lag; fix: rollout.weight_lag: "
                f"{learner.max_staleness} on the sim backend")
    return None


def reproducible(config: Mapping[str, Any]) -> bool:
    """``sim.reproducible`` of a resolved config (true unless a grid opts out)."""
    section = config.get("sim") or {}
    return not isinstance(section, Mapping) or section.get("reproducible", True) is not False
