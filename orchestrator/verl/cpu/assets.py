"""Build the tiny model, tokenizer and parquet data a CPU verl trial needs, without downloading.

Everything is made in code and cached under ``<cache_root>/<hash>/``, where the hash covers the
spec (model shape, task, sizes, seed), the source of this module, ``task.py`` and ``reward.py``,
and the torch / transformers / tokenizers versions that serialise them: change any of those and a
new directory is built; reuse them and the same bytes are reused. A directory is built under a
temporary name and renamed into place, so a killed build never leaves a half-written cache entry.

Layout of one entry::

    model/        Qwen2 config + safetensors weights + tokenizer files + chat template
    train.parquet, val.parquet   rows in verl's RL format
    spec.json     what built it (for humans and for the launcher)
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.exceptions import GridError
from orchestrator.store import workspace
from orchestrator.verl.cpu import reward as reward_module
from orchestrator.verl.cpu import task as task_module
from orchestrator.verl.cpu.envvars import CACHE_ENV
from orchestrator.verl.cpu.task import TaskSpec

PAD, EOS, UNK = "<pad>", "<|im_end|>", "<unk>"
# "\n" and "<|im_end|>" must exist: verl's Continuous Token builder for model_type qwen2
# (utils/tokenizer/continuous_token.py QwenContinuousTokenBuilder) requires both.
CHARS = ("\n", " ", "=", *"0123456789")
# The chat template renders the user's digits followed by "=": the answer starts right after it.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}={% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the randomly initialised Qwen2 (small enough for 2 CPU cores)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    init_seed: int = 0


@dataclass(frozen=True)
class AssetSpec:
    """Everything that determines the bytes of a cache entry."""

    model: ModelSpec = field(default_factory=ModelSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    n_train: int = 1024
    n_val: int = 64
    data_seed: int = 0


@dataclass(frozen=True)
class Assets:
    """Paths of a built cache entry."""

    root: Path
    model_dir: Path
    train_file: Path
    val_file: Path
    reward_file: Path
    data_source: str


def default_cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ablate_verl_cpu"


def content_hash(spec: AssetSpec) -> str:
    """Hash of the spec, the builder's source and the serialising libraries' versions."""
    from importlib.metadata import version

    # Versions from the package metadata: plan time computes the path without importing torch.
    payload = {
        "spec": asdict(spec),
        "builder": inspect.getsource(inspect.getmodule(content_hash)),
        "task": inspect.getsource(task_module),
        "reward": inspect.getsource(reward_module),
        "versions": [version("torch"), version("transformers"), version("tokenizers")],
    }
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build(spec: AssetSpec | None = None, cache_root: Path | None = None) -> Assets:
    """Return the cache entry for ``spec``, building it first if it is missing."""
    spec = spec or AssetSpec()
    located = locate(spec, cache_root or default_cache_root())
    root = located.root
    if not (root / "spec.json").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            _build_into(tmp, spec)
            try:
                os.rename(tmp, root)
            except OSError:  # another builder won the race: its entry has the same bytes
                if not (root / "spec.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return located


def _build_into(out: Path, spec: AssetSpec) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir = out / "model"
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)
    build_model(spec.model, tokenizer).save_pretrained(model_dir)
    write_data(out, spec)
    (out / "spec.json").write_text(json.dumps(asdict(spec), indent=2, sort_keys=True))


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A one-token-per-character tokenizer that loads back identically through AutoTokenizer.

    It is a byte-level BPE with no merges: for a ``qwen2`` config, transformers 5 ignores the
    saved ``tokenizer_class`` and rebuilds the tokenizer as ``Qwen2Tokenizer`` (byte-level
    pre-tokenizer and decoder), so the vocabulary is written in the byte-level alphabet
    ("\n" is "\u010a", " " is "\u0120") and the saved pipeline is the same as the one Qwen2's
    class builds. Then the file and the class tokenize alike: one character, one token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_char = _bytes_to_unicode()
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in CHARS:
        vocab["".join(byte_char[b] for b in ch.encode())] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([PAD, EOS, UNK])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                        unk_token=UNK, model_max_length=1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest above 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_model(spec: ModelSpec, tokenizer):  # -> transformers.Qwen2ForCausalLM
    """A randomly initialised Qwen2 whose vocabulary is exactly the tokenizer's."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, use_cache=True,
    )
    torch.manual_seed(spec.init_seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model


def rows(spec: AssetSpec, split: str, n: int, seed: int) -> list[dict]:
    """``n`` rows in verl's RL format (``prompt`` as chat messages, ``reward_model.ground_truth``)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        digits = spec.task.sample(rng)
        out.append({
            "data_source": spec.task.data_source,
            "prompt": [{"role": "user", "content": digits}],
            "ability": spec.task.name,
            "reward_model": {"style": "rule", "ground_truth": spec.task.target(digits)},
            "extra_info": {"split": split, "index": i},
        })
    return out


def write_data(out: Path, spec: AssetSpec) -> None:
    import pandas as pd

    # Distinct seeds per split; with 1-2 digits the two splits overlap (only 110 prompts exist),
    # which is fine for a smoke task: validation measures what the policy does, not generalisation.
    pd.DataFrame(rows(spec, "train", spec.n_train, spec.data_seed)).to_parquet(out / "train.parquet")
    pd.DataFrame(val_rows(spec)).to_parquet(out / "val.parquet")


def val_rows(spec: AssetSpec) -> list[dict]:
    """The validation rows (``val.parquet``; the reference evaluator scores the same prompts)."""
    return rows(spec, "val", spec.n_val, spec.data_seed + 1)


# --------------------------------------------------------------------------- recipes

RECIPE_FIELDS = ("task", "min_digits", "max_digits", "n_train", "n_val", "data_seed",
                 "num_attention_heads", "num_key_value_heads")


def spec_from_recipe(section: dict) -> AssetSpec:
    """The ``assets:`` section of a verl recipe (``recipes/verl/cpu_tiny.yaml``) as a spec."""
    unknown = sorted(set(section) - set(RECIPE_FIELDS))
    if unknown:
        raise ValueError(f"unknown assets key(s) {unknown}; allowed: {list(RECIPE_FIELDS)}")
    task = TaskSpec(str(section.get("task", "copy")), int(section.get("min_digits", 1)),
                    int(section.get("max_digits", 2)))
    base = ModelSpec()
    model = ModelSpec(
        num_attention_heads=int(section.get("num_attention_heads", base.num_attention_heads)),
        num_key_value_heads=int(section.get("num_key_value_heads", base.num_key_value_heads)))
    if model.hidden_size % model.num_attention_heads or \
            model.num_attention_heads % model.num_key_value_heads:
        raise ValueError(f"num_attention_heads {model.num_attention_heads} must divide the hidden "
                         f"size {model.hidden_size} and be a multiple of num_key_value_heads "
                         f"{model.num_key_value_heads}")
    return AssetSpec(model=model, task=task, n_train=int(section.get("n_train", 1024)),
                     n_val=int(section.get("n_val", 64)), data_seed=int(section.get("data_seed", 0)))


def locate(spec: AssetSpec, cache_root: Path) -> Assets:
    """Where ``build(spec, cache_root)`` puts (or has put) the entry; builds nothing."""
    root = cache_root / content_hash(spec)
    return Assets(root=root, model_dir=root / "model", train_file=root / "train.parquet",
                  val_file=root / "val.parquet", reward_file=Path(reward_module.__file__).resolve(),
                  data_source=spec.task.data_source)


def verl_values(built: Assets) -> dict[str, str]:
    """The verl keys an asset entry fills in (model, data, reward)."""
    return {"actor_rollout_ref.model.path": str(built.model_dir),
            "data.train_files": str(built.train_file), "data.val_files": str(built.val_file),
            "reward.custom_reward_function.path": str(built.reward_file),
            "reward.custom_reward_function.name": "compute_score"}


# The recipe's `assets:` section as verl paths (plan time and run time share this).
def asset_values(config: Mapping[str, Any], root: str | None = None) -> dict[str, str]:
    """verl paths of the recipe's ``assets:`` (model, tokenizer, data built in code and cached
    under ``<workdir>/assets/verl_cpu/<content hash>``), or {} without that section."""
    section = config.get("assets")
    if not section:
        return {}
    try:
        spec = spec_from_recipe(dict(section))
    except (TypeError, ValueError) as exc:
        raise GridError(f"recipe assets: {exc}", key="assets") from None
    return verl_values(locate(spec, assets_cache(root)))


def assets_cache(root: str | None = None) -> Path:
    return Path(root) if root else workspace.workdir() / "assets" / "verl_cpu"
