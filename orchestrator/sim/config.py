"""Turn a trial's resolved recipe dict into the simulator's typed objects, validating first.

Every user mistake (unknown key, bad value, a correction the model cannot run) is raised here,
before any tensor is allocated, as a one-line UserError naming the key and the fix.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.pools import PoolSpec
from orchestrator.sim.profile import (
    Numerics,
    check_rollout,
    explain,
    parse_profile,
    resolve_numerics,
)

SECTIONS = ("model", "task", "train", "eval", "sim", "correction", "rollout")
MODEL_KEYS = ("arch", "d_model", "n_layers", "n_heads", "d_ff", "n_experts", "top_k",
              "expert_d_ff", "aux_loss_coef")
TASK_KEYS = ("name", "digits", "answer", "response_len", "vocab", "max_step", "aliases")
TRAIN_KEYS = ("lr", "prompts_per_step", "group_size", "ppo_epochs", "minibatches", "clip_eps",
              "kl_coef", "grad_clip", "weight_decay", "adam_beta1", "adam_beta2", "threads")
EVAL_KEYS = ("every", "prompts")
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
    reproducible: bool = True  # pinned CPU numerics (orchestrator/numerics.py)


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
    _need(task.get("name", "progression") in TASK_NAMES, "task.name",
          f"must be one of {', '.join(TASK_NAMES)}, got {task.get('name')!r}"[:200])
    correction = _spec(CorrectionSpec, config.get("correction") or {}, "correction")
    rollout = _spec(RolloutSpec, config.get("rollout") or {}, "rollout")
    _need(pool.kind == "sim", "pool", f"{pool.name} is a {pool.kind} pool; the sim backend "
          "needs a sim-* pool")
    problem = check_rollout(rollout, pool.sim_profile, pool.name)
    if problem:
        raise UserError(problem)
    numerics = resolve_numerics(parse_profile(pool.sim_profile, pool.name), rollout)

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
    threads = train.pop("threads", 1)
    _need(isinstance(threads, int) and threads >= 1, "train.threads", f"must be >= 1, got {threads}")
    if "aux_loss_coef" in model:
        train["aux_loss_coef"] = model.pop("aux_loss_coef")
    if "every" in ev:
        train["eval_every"] = ev["every"]
    if "prompts" in ev:
        train["eval_prompts"] = ev["prompts"]
    return SimSetup(model, task, train, correction, rollout, numerics, threads,
                    sim.get("reproducible", True))


def reproducible(config: Mapping[str, Any]) -> bool:
    """``sim.reproducible`` of a resolved config (true unless a grid opts out)."""
    section = config.get("sim") or {}
    return not isinstance(section, Mapping) or section.get("reproducible", True) is not False
