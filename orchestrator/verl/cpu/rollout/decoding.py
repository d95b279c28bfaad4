"""Token-by-token decoding with a KV cache, and the sampling rules verl's rollouts follow.

This is the CPU rollout engine's numeric path: a prefill of the prompt, then one forward per new
token that reuses the cache (``past_key_values``), in the rollout's own dtype. The trainer
recomputes the same tokens' log-probs in one full-sequence forward under FSDP mixed precision,
so the two differ by real arithmetic (dtype, cache vs no cache, reduction order): that is the
training-inference mismatch the project ablates. Nothing here adds noise.

Log-prob convention: the returned log-prob of a sampled token is taken from
``log_softmax(logits / temperature)`` over the *full* vocabulary, before top-k / top-p filtering.
That is the quantity verl's actor recomputes (it divides logits by the rollout temperature and
never truncates), so with top-k / top-p on, mismatch metrics do not pick up the truncation. At
temperature 0 (greedy, verl's validation default) the log-prob is ``log_softmax(logits)``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

# Keys verl's agent loops put into sampling_params that this engine consumes or may ignore.
_IGNORED = frozenset({"logprobs", "n", "seed"})


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings, validated."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: frozenset[int] = frozenset()
    want_logprobs: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_verl(cls, params: Mapping[str, Any], *, default_max_new_tokens: int,
                  eos_token_ids: Iterable[int], ignore_eos: bool) -> SamplingParams:
        """Build from the dict verl's agent loop sends (vLLM/SGLang-style keys).

        Refuses what this engine does not implement instead of silently ignoring it.
        """
        params = dict(params)
        max_new = params.pop("max_new_tokens", params.pop("max_tokens", None))
        penalty = float(params.pop("repetition_penalty", 1.0) or 1.0)
        if penalty != 1.0:
            raise NotImplementedError(f"repetition_penalty={penalty}: the CPU rollout samples "
                                      "without penalties")
        if params.pop("prompt_logprobs", None) is not None:
            raise NotImplementedError("prompt_logprobs (teacher distillation) is not supported "
                                      "by the CPU rollout")
        stop = {int(t) for t in params.pop("stop_token_ids", None) or ()}
        if not ignore_eos:
            stop.update(int(t) for t in eos_token_ids)
        top_k = params.pop("top_k", -1)
        out = cls(
            max_new_tokens=int(default_max_new_tokens if max_new is None else max_new),
            temperature=float(params.pop("temperature", 1.0)),
            top_p=float(params.pop("top_p", 1.0)),
            top_k=-1 if top_k is None else int(top_k),
            stop_token_ids=frozenset(stop),
            want_logprobs=bool(params.pop("logprobs", True)),
        )
        unknown = set(params) - _IGNORED
        if unknown:
            raise NotImplementedError(f"sampling params {sorted(unknown)} are not supported by "
                                      "the CPU rollout")
        return out


@dataclass(frozen=True)
class Decoded:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" (a stop token was sampled) or "length"


def filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) what top-k and then top-p exclude; ``scaled`` is 1-D, temperature applied."""
    out = scaled.clone()
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token if the mass strictly before it already reaches top_p (keeps at least one).
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        out[drop] = float("-inf")
    return out


def sample_next(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator) -> tuple[int, float]:
    """Pick the next token from 1-D float32 logits; return it and its log-prob (see module doc)."""
    if params.greedy:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    scaled = logits / params.temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    kept = filter_logits(scaled, params.top_k, params.top_p)
    probs = torch.softmax(kept, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(log_probs[token])


@torch.inference_mode()
def decode(model: torch.nn.Module, prompt_ids: list[int], params: SamplingParams,
           generator: torch.Generator) -> Decoded:
    """Prefill ``prompt_ids``, then sample up to ``max_new_tokens`` reusing the KV cache."""
    tokens: list[int] = []
    log_probs: list[float] = []
    if params.max_new_tokens == 0:
        return Decoded(tokens, log_probs, "length")
    out = model(input_ids=torch.tensor([prompt_ids], dtype=torch.long), use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float()
    while True:
        token, log_prob = sample_next(logits, params, generator)
        tokens.append(token)
        log_probs.append(log_prob)
        if token in params.stop_token_ids:
            return Decoded(tokens, log_probs, "stop")
        if len(tokens) == params.max_new_tokens:
            return Decoded(tokens, log_probs, "length")
        out = model(input_ids=torch.tensor([[token]], dtype=torch.long), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
