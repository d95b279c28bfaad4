"""Will a verl trial fit in a cpu pool's memory? A plan-time estimate from the recipe alone.

A cpu pool runs the whole job on one machine, so its memory is the pool's ``memory_per_node``
or, undeclared, this machine's RAM. The estimate (no verl or torch import) is:

* a fixed cost per job and per extra rank: driver, Ray daemons, TransferQueue, agent-loop and
  reward workers, each a Python process with torch loaded (measured: 5.76 GB peak RSS for a
  1-rank job of a 30k-parameter model, 6.96 GB for 2 ranks: README "verl on CPU");
* the trainer's state, fp32 on cpu pools: weights, gradients and Adam's two moments, 16 B per
  parameter over all ranks (FSDP shards it), plus one unsharded fp32 copy per rank (FSDP2
  gathers the full state dict for every weight sync), plus a fp32 reference model when a KL
  term needs one;
* the rollout engine's copy of the weights in its dtype and the KV cache of one prompt's group;
* training activations of one micro-batch per rank: per layer ~34 hidden-sized fp32 values per
  token (one per layer with gradient checkpointing), and the logits with their log-softmax and
  gradient.

The model's shape comes from the recipe's in-code ``assets:`` (``verl_cpu/assets.py``), else the
``config.json`` of a local ``actor_rollout_ref.model.path`` (or of its Hugging Face cache
entry), else the parameter count in the model's name (``Qwen3-4B`` -> 4e9). A model none of these
describe is not refused.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.pools import PoolSpec
from orchestrator.verl.cpu.assets import CHARS, ModelSpec
from orchestrator.verl.topology import config_value, world_size

JOB_BASE_GB = 5.8  # 1-rank job of the tiny model (measured peak RSS, all processes)
PER_RANK_GB = 1.2  # each further gloo rank (measured: 2 ranks 6.96 GB)
MODEL_PATH = "actor_rollout_ref.model.path"
_SIZE_IN_NAME = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*([BbMm])(?![a-zA-Z])")
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30,
          "ti": 2**40}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about the model, and where it was read from."""

    params: float
    hidden: int
    layers: int
    vocab: int
    kv_width: int  # key/value heads x head dim
    source: str


def model_shape(config: Mapping[str, Any]) -> ModelShape | None:
    """The model of a resolved verl recipe config, or None if nothing describes it."""
    if config.get("assets"):
        spec = ModelSpec()
        return _from_hf({"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
                         "num_hidden_layers": spec.num_hidden_layers,
                         "num_attention_heads": spec.num_attention_heads,
                         "num_key_value_heads": spec.num_key_value_heads,
                         "vocab_size": 3 + len(CHARS), "tie_word_embeddings": True},
                        "the recipe's in-code model (assets:)")
    path = config_value(config, MODEL_PATH)
    if not isinstance(path, str) or not path or path == "???":
        return None
    for candidate in _config_files(path):
        try:
            return _from_hf(json.loads(candidate.read_text()), f"{candidate.name} of {path}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    match = _SIZE_IN_NAME.search(Path(path).name)
    if match is None:
        return None
    params = float(match.group(1)) * (1e9 if match.group(2) in "Bb" else 1e6)
    # Shape of a typical decoder of that size (only the parameter count is from the name).
    hidden = int(min(max((params / 12 / 32) ** 0.5, 256), 16384))
    return ModelShape(params, hidden, 32, 152_064, hidden // 4, f"the size in its name {path!r}")


def _config_files(path: str) -> list[Path]:
    local = Path(path).expanduser()
    if local.is_dir():
        return [local / "config.json"]
    if path.count("/") != 1 or path.startswith((".", "/")):
        return []
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get(
        "HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    snapshots = hub / f"models--{path.replace('/', '--')}" / "snapshots"
    return sorted(snapshots.glob("*/config.json"))


def _from_hf(cfg: Mapping[str, Any], source: str) -> ModelShape:
    hidden, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    heads = int(cfg.get("num_attention_heads") or 1)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    kv = int(cfg.get("num_key_value_heads") or heads) * head_dim
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    per_layer = hidden * heads * head_dim * 2 + hidden * kv * 2 + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return ModelShape(float(per_layer * layers + embed), hidden, layers, vocab, kv, source)


def estimate_gb(config: Mapping[str, Any], pool: PoolSpec, shape: ModelShape) -> float:
    """Peak resident memory of the whole job, in GiB (see the module docstring)."""
    world = world_size(pool, config)
    p = shape.params
    trainer = 16 * p + 4 * p * world
    kl = config_value(config, "actor_rollout_ref.actor.use_kl_loss") or config_value(
        config, "algorithm.use_kl_in_reward")
    ref = 4 * p if kl else 0.0
    dtype = str(pool.verl_overrides.get("actor_rollout_ref.rollout.dtype", "bfloat16"))
    width = 4 if "32" in dtype else 2
    seq = int(config_value(config, "data.max_prompt_length", 512) or 512) + int(
        config_value(config, "data.max_response_length", 512) or 512)
    batch = int(config_value(config, "data.train_batch_size", 1) or 1) * int(
        config_value(config, "actor_rollout_ref.rollout.n", 1) or 1)
    n = int(config_value(config, "actor_rollout_ref.rollout.n", 1) or 1)
    rollout = width * p + n * seq * shape.layers * 2 * shape.kv_width * width  # one prompt's group
    micro = int(config_value(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1) or 1)
    tokens = min(micro, max(batch // world, 1)) * seq
    # Gradient checkpointing keeps one hidden state per layer and one layer's full activations.
    per_token = (shape.hidden * (shape.layers + 34) if config_value(
        config, "actor_rollout_ref.model.enable_gradient_checkpointing") else
        34 * shape.hidden * shape.layers)
    activations = world * tokens * (per_token + 3 * shape.vocab) * 4
    return JOB_BASE_GB + PER_RANK_GB * (world - 1) + (trainer + ref + rollout + activations) / 2**30


def pool_memory_gb(pool: PoolSpec) -> tuple[float, str]:
    """The memory a cpu pool offers (GiB) and what that figure is."""
    if pool.memory_per_node:
        return _parse_quantity(pool.memory_per_node) / 2**30, f"its memory_per_node {pool.memory_per_node}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / 2**30, "this machine's RAM"


def _parse_quantity(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"memory_per_node {text!r}: use a Kubernetes quantity such as 64Gi")
    return float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]


def check_memory(config: Mapping[str, Any], pool: PoolSpec) -> str | None:
    """``"key: problem"`` if the trial would not fit in cpu pool ``pool``'s memory, else None."""
    if pool.kind != "cpu":
        return None  # GPU pools: GPU memory is verl's and SGLang's to plan (gpu_memory_utilization)
    shape = model_shape(config)
    if shape is None:
        return None
    need = estimate_gb(config, pool, shape)
    try:
        have, what = pool_memory_gb(pool)
    except ValueError as exc:
        return f"pool {pool.name}: {exc}"
    if need <= have:
        return None
    return (f"{MODEL_PATH}: the model ({shape.params:.3g} parameters, from {shape.source}) needs "
            f"~{need:.0f} GB on cpu pool {pool.name!r} (fp32 weights, gradients and Adam state, "
            "a gathered copy per rank, the rollout engine's copy and KV cache, activations, "
            f"~{JOB_BASE_GB:.0f} GB of verl and Ray processes), more than {what} ({have:.1f} GB); "
            "fix: a smaller model (the recipe verl/cpu_tiny runs here) or a gpu pool")
