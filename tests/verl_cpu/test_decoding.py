"""The CPU rollout's decode loop against a full-sequence forward, and its sampling rules."""
from __future__ import annotations

import torch

from orchestrator.verl.cpu import assets
from orchestrator.verl.cpu.rollout.decoding import (
    SamplingParams,
    decode,
    filter_logits,
    sample_next,
)


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    tok = assets.build_tokenizer()
    return assets.build_model(assets.ModelSpec(), tok).to(dtype).eval()


def _full_forward_logprobs(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(tokens)]


def test_kv_cache_decode_matches_full_forward_in_fp32():
    model = _model()
    prompt = [9, 13, 5]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=frozenset())
    out = decode(model, prompt, params, torch.Generator().manual_seed(0))
    assert len(out.token_ids) == 8 and out.finish_reason == "length"
    ref = _full_forward_logprobs(model, prompt, out.token_ids)
    assert max(abs(a - b) for a, b in zip(out.log_probs, ref)) < 1e-5


def test_bf16_decode_differs_from_fp32_but_stays_close():
    model32, model16 = _model(), _model(torch.bfloat16)
    prompt = [9, 13, 5]
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    out = decode(model16, prompt, params, torch.Generator().manual_seed(0))
    ref = _full_forward_logprobs(model32, prompt, out.token_ids)
    diff = max(abs(a - b) for a, b in zip(out.log_probs, ref))
    assert 0 < diff < 0.1


def test_stops_at_eos_and_greedy_is_argmax():
    model = _model()
    prompt = [9, 13, 5]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    out = decode(model, prompt, greedy, torch.Generator())
    ref = decode(model, prompt, greedy, torch.Generator().manual_seed(123))
    assert out.token_ids == ref.token_ids  # no randomness at temperature 0
    first = out.token_ids[0]
    stop = SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=frozenset({first}))
    stopped = decode(model, prompt, stop, torch.Generator())
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


def test_top_k_and_top_p_filtering():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0])
    kept = filter_logits(logits, top_k=2, top_p=1.0)
    assert torch.isinf(kept[2:]).all() and torch.isfinite(kept[:2]).all()
    probs = torch.softmax(logits, dim=-1)  # [0.64, 0.24, 0.09, 0.03]
    kept = filter_logits(logits, top_k=-1, top_p=0.7)
    assert torch.isfinite(kept[:2]).all() and torch.isinf(kept[2:]).all(), probs
    kept = filter_logits(logits, top_k=-1, top_p=0.5)
    assert torch.isfinite(kept[0]) and torch.isinf(kept[1:]).all()
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1)
    token, logp = sample_next(logits, params, torch.Generator().manual_seed(0))
    # The log-prob is of the untruncated distribution (what verl's actor recomputes).
    assert token == 0 and abs(logp - float(torch.log_softmax(logits, -1)[0])) < 1e-6


def test_from_verl_refuses_what_it_does_not_implement():
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
            "logprobs": True}
    p = SamplingParams.from_verl(base, default_max_new_tokens=5, eos_token_ids=[1],
                                 ignore_eos=False)
    assert p.max_new_tokens == 5 and p.stop_token_ids == {1}
    p = SamplingParams.from_verl({**base, "max_tokens": 3}, default_max_new_tokens=5,
                                 eos_token_ids=[1], ignore_eos=True)
    assert p.max_new_tokens == 3 and p.stop_token_ids == frozenset()
    for bad in ({"repetition_penalty": 1.1}, {"prompt_logprobs": 0}, {"min_p": 0.1}):
        try:
            SamplingParams.from_verl({**base, **bad}, default_max_new_tokens=5,
                                     eos_token_ids=[1], ignore_eos=False)
        except NotImplementedError:
            continue
        raise AssertionError(f"{bad} was accepted")
