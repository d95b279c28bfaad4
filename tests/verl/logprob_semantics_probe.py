"""Which log-probs a GPU engine returns for the tokens it samples, run on the installed engine's
own sampler (CPU, tiny tensors), for tests/verl/test_engine_contract.py.

Imported by ``engine_contract_probe.py`` (which runs in a GPU stack's Python) and its result
returned under ``"logprobs"``; standalone ``python logprob_semantics_probe.py sglang|vllm``
prints the same JSON. ``orchestrator/verl/engines.py: logprob_problem`` rests on it.

For each case, the sampling parameters verl 0.9.1 sends (agent_loop.py:590-596: temperature,
top_p, top_k, repetition_penalty 1.0, log-probs on) go to the engine's sampler on one small
batch of random logits, several draws (SGLang: through its own ``SamplingParams`` and
``SamplingBatchInfo``; vLLM: a ``SamplingMetadata`` made here as its input batch makes one,
top_p 1.0 and top_k -1 being no filter); every returned log-prob of a sampled token is
compared with

* ``full``: log_softmax(logits / T) over the whole vocabulary (what verl's trainer recomputes),
* ``raw``: log_softmax(logits), before temperature,
* ``nucleus``: the log-prob renormalised over the top-k / top-p set the token was drawn from,

as the largest absolute difference, and whether every sampled token lies in that set.

What runs where no GPU is (on a GPU the engine's kernels run instead):

* SGLang: ``Sampler.forward`` and ``SamplingBatchInfo.from_schedule_batch`` run as installed;
  the server arguments they read are ``ServerArgs``' own defaults without ``__post_init__``
  (which needs a device), ``get_tp_group`` is a stand-in (no process group). Both sampling
  backends: ``pytorch`` runs as is; ``flashinfer`` (what ``__post_init__`` picks on a GPU)
  has its CUDA kernels replaced by SGLang's torch implementation on a copy of the
  probabilities, as flashinfer's own op declares (``mutates_args=()``: it never writes into
  them; asserted from its source). ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is a module constant read
  at import: the case with it on sets that constant.
* vLLM: ``Sampler.forward`` (V1 model runner) with ``logprobs_mode`` processed_logprobs and
  raw_logprobs; with no GPU platform ``TopKTopPSampler`` takes ``forward_native``, which is the
  CUDA path too whenever processed log-probs are asked for (flashinfer cannot return them,
  topk_topp_sampler.py ``__init__``); batches under 8 rows take the torch top-k/top-p
  (``apply_top_k_top_p``), as on a GPU. The V2 model runner's sampler (the default for some
  architectures) needs GPU state: its choice of tensor is asserted from its source.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import re
import sys
import types
from pathlib import Path

VOCAB, ROWS, DRAWS, SEED = 48, 4, 6, 0
# name -> the sampling parameters verl sends for it (top_k -1: off, top_p 1.0: off)
CASES = {
    "T=1.0": {"temperature": 1.0, "top_p": 1.0, "top_k": -1},
    "T=0.7": {"temperature": 0.7, "top_p": 1.0, "top_k": -1},
    "T=0.7,top_p=0.6": {"temperature": 0.7, "top_p": 0.6, "top_k": -1},
    "T=1.0,top_p=0.6": {"temperature": 1.0, "top_p": 0.6, "top_k": -1},
    "T=0.7,top_k=4": {"temperature": 0.7, "top_p": 1.0, "top_k": 4},
    "T=0.7,top_p=0.8,top_k=4": {"temperature": 0.7, "top_p": 0.8, "top_k": 4},
}


def _device() -> str:
    """Where the engine's sampler runs: a GPU where there is one (its kernels take no CPU
    tensors), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _logits():
    import torch

    gen = torch.Generator().manual_seed(SEED)
    return (torch.randn(ROWS, VOCAB, generator=gen, dtype=torch.float32) * 3.0).to(_device())


def _references(logits, temperature: float, top_p: float, top_k: int, renormalise_top_k: bool):
    """(full, raw, nucleus log-probs, nucleus mask) for one case, computed here: top-k, then
    top-p on the mass above each token, that mass taken after renormalising over the top k
    (vLLM's apply_top_k_top_p) or not (SGLang's top_k_top_p_min_p_sampling_from_probs_torch)."""
    import torch

    full = torch.log_softmax(logits / temperature, dim=-1)
    raw = torch.log_softmax(logits, dim=-1)
    probs = full.exp()
    order = probs.argsort(dim=-1, descending=True)
    sorted_probs = probs.gather(-1, order)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    kept = sorted_probs * keep
    if renormalise_top_k:
        kept = kept / kept.sum(dim=-1, keepdim=True)
    before = kept.cumsum(dim=-1) - kept  # the mass strictly above each token
    keep &= before < top_p
    mask = torch.zeros_like(keep).scatter(-1, order, keep)
    nucleus_probs = torch.where(mask, probs, torch.zeros_like(probs))
    nucleus = torch.log(nucleus_probs / nucleus_probs.sum(dim=-1, keepdim=True))
    return full, raw, nucleus, mask


def _compare(logits, params: dict, draws: list, renormalise_top_k: bool) -> dict:
    """draws: [(token ids [ROWS], returned log-probs [ROWS]), ...] -> the case's record."""
    import torch

    logits = logits.cpu()
    full, raw, nucleus, mask = _references(logits, params["temperature"], params["top_p"],
                                           params["top_k"], renormalise_top_k)
    rows = torch.arange(ROWS)
    out = {"params": params, "full": 0.0, "raw": 0.0, "nucleus": 0.0, "in_nucleus": True,
           "log_mass_of_nucleus": float(torch.logsumexp(
               torch.where(mask, full, torch.full_like(full, -math.inf)), dim=-1).min())}
    for ids, got in draws:
        ids, got = ids.cpu().long().view(-1), got.cpu().double().view(-1)
        for name, ref in (("full", full), ("raw", raw), ("nucleus", nucleus)):
            diff = (got - ref[rows, ids].double()).abs().max().item()
            out[name] = max(out[name], diff if math.isfinite(diff) else math.inf)
        out["in_nucleus"] &= bool(mask[rows, ids].all())
    return out


# --------------------------------------------------------------------------- SGLang


class _Batch:
    """What ``SamplingBatchInfo.from_schedule_batch`` reads of a ``ScheduleBatch``."""

    def __init__(self, reqs, device: str) -> None:
        self.reqs, self.device = reqs, device


def _sglang_server_args(**overrides):
    """``ServerArgs`` with its dataclass defaults, without ``__post_init__`` (needs a GPU)."""
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for key, value in overrides.items():
        object.__setattr__(args, key, value)
    return args


@contextlib.contextmanager
def _sglang_runtime(server_args):
    """Global server arguments, a stand-in TP group and CPU stand-ins of the flashinfer kernels
    while one case runs; everything put back after."""
    import torch
    from sglang.srt import server_args as sa
    from sglang.srt.layers import sampler

    def top_k_top_p_sampling_from_probs(probs, top_ks, top_ps, filter_apply_order="joint",
                                        check_nan=False):
        assert filter_apply_order == "joint"
        return sampler.top_k_top_p_min_p_sampling_from_probs_torch(
            probs.clone(), top_ks, top_ps, torch.zeros_like(top_ps), False, None, None)

    saved = {name: getattr(sampler, name, None) for name in (
        "get_tp_group", "top_k_top_p_sampling_from_probs")}
    saved_args = sa._global_server_args
    sa.set_global_server_args_for_scheduler(server_args)
    sampler.get_tp_group = lambda: types.SimpleNamespace(device_group=None)
    if saved["top_k_top_p_sampling_from_probs"] is None:  # not imported: no CUDA here
        sampler.top_k_top_p_sampling_from_probs = top_k_top_p_sampling_from_probs
    try:
        yield sampler
    finally:
        sa._global_server_args = saved_args
        for name, value in saved.items():
            if value is None:
                sampler.__dict__.pop(name, None)
            else:
                setattr(sampler, name, value)


def _sglang_case(params: dict, backend: str, original_logprob: bool = False) -> dict:
    import torch
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

    logits = _logits()
    with _sglang_runtime(_sglang_server_args(sampling_backend=backend)) as sampler:
        reqs = []
        for _ in range(ROWS):
            sp = SamplingParams(**params, repetition_penalty=1.0, max_new_tokens=4)
            sp.normalize(None)
            sp.verify(VOCAB)
            reqs.append(types.SimpleNamespace(sampling_params=sp, custom_logit_processor=None))
        batch = _Batch(reqs, _device())
        info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
        flags = {k: getattr(info, k) for k in ("is_all_greedy", "need_top_p_sampling",
                                                "need_top_k_sampling", "need_min_p_sampling")}
        the_sampler = sampler.Sampler()
        saved_flag = sampler.SGLANG_RETURN_ORIGINAL_LOGPROB
        sampler.SGLANG_RETURN_ORIGINAL_LOGPROB = original_logprob
        draws = []
        try:
            torch.manual_seed(SEED)
            for _ in range(DRAWS):
                out = LogitsProcessorOutput(next_token_logits=logits.clone())
                info.update_regex_vocab_mask()  # ModelRunner._preprocess_logits
                info.apply_logits_bias(out.next_token_logits)
                ids = the_sampler.forward(out, info, True, [0] * ROWS, [None] * ROWS,
                                          torch.zeros(ROWS, dtype=torch.long,
                                                      device=_device()))
                draws.append((ids, out.next_token_logprobs))
        finally:
            sampler.SGLANG_RETURN_ORIGINAL_LOGPROB = saved_flag
    return {**_compare(logits, params, draws, renormalise_top_k=False), **flags, "backend": backend,
            "original_logprob": original_logprob}


def _verl_mentions(*needles: str) -> dict[str, list[str]]:
    """needle -> the installed verl files whose source names it."""
    import verl

    root = Path(verl.__file__).parent
    found: dict[str, list[str]] = {n: [] for n in needles}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        for needle in needles:
            if needle in text:
                found[needle].append(str(path.relative_to(root.parent)))
    return found


def sglang() -> dict:
    import flashinfer.sampling
    import sglang as sgl
    from sglang.srt.layers import sampler
    from sglang.srt.server_args import ServerArgs

    cases = {}
    for name, params in CASES.items():
        for backend in ("flashinfer", "pytorch"):
            cases[f"{name} {backend}"] = _sglang_case(params, backend)
    for name in ("T=0.7", "T=0.7,top_p=0.6"):
        cases[f"{name} flashinfer SGLANG_RETURN_ORIGINAL_LOGPROB"] = _sglang_case(
            CASES[name], "flashinfer", original_logprob=True)
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs) if f.name in (
        "sampling_backend", "rl_on_policy_target", "enable_deterministic_inference")}
    fi_source = inspect.getsource(flashinfer.sampling)
    return {
        "version": sgl.__version__,
        "cases": cases,
        "server_args_defaults": defaults,
        # __post_init__'s choice where sampling_backend is None (a GPU: flashinfer)
        "backend_choice": re.sub(r"\s+", " ", inspect.getsource(
            ServerArgs._handle_sampling_backend)).strip(),
        "original_logprob_env": {
            "reads_env": 'get_bool_env_var("SGLANG_RETURN_ORIGINAL_LOGPROB")'
                         in inspect.getsource(sampler),
            "value_here": sampler.SGLANG_RETURN_ORIGINAL_LOGPROB,
            "set_here": "SGLANG_RETURN_ORIGINAL_LOGPROB" in os.environ},
        "flashinfer_sampling_op_mutates_nothing": bool(re.search(
            r'register_custom_op\(\s*"flashinfer::top_k_top_p_sampling_from_probs",\s*'
            r"mutates_args=\(\)\s*\)", fi_source)),
        "verl_mentions": _verl_mentions("SGLANG_RETURN_ORIGINAL_LOGPROB", "rl_on_policy_target",
                                        "custom_logit_processor", "sampling_backend"),
    }


# --------------------------------------------------------------------------- vLLM


def _vllm_case(params: dict, mode: str) -> dict:
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    logits, dev = _logits(), _device()
    top_p = params["top_p"] if params["top_p"] < 1.0 else None
    top_k = params["top_k"] if params["top_k"] > 0 else None
    # what vLLM's InputBatch makes of verl's SamplingParams: top_p 1.0 / top_k -1 are no filter
    meta = SamplingMetadata(
        temperature=torch.full((ROWS,), params["temperature"], device=dev), all_greedy=False,
        all_random=True,
        top_p=None if top_p is None else torch.full((ROWS,), top_p, device=dev),
        top_k=None if top_k is None else torch.full((ROWS,), top_k, dtype=torch.int32,
                                                    device=dev),
        generators={}, max_num_logprobs=0, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(ROWS, device=dev),
        presence_penalties=torch.zeros(ROWS, device=dev),
        repetition_penalties=torch.ones(ROWS, device=dev),
        output_token_ids=[[] for _ in range(ROWS)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    sampler = Sampler(logprobs_mode=mode)
    torch.manual_seed(SEED)
    draws = []
    for _ in range(DRAWS):
        out = sampler(logits.clone(), meta)
        tensors = out.logprobs_tensors
        ids = out.sampled_token_ids.view(-1)
        # column 0: the sampled token (gather_logprobs)
        assert (tensors.logprob_token_ids[:, 0].long() == ids.long()).all()
        draws.append((ids, tensors.logprobs[:, 0]))
    return {**_compare(logits, params, draws, renormalise_top_k=True), "mode": mode,
            "top_k_top_p_forward": sampler.topk_topp_sampler.forward.__name__}


def vllm() -> dict:
    import vllm as vllm_package
    from vllm.v1.sample import sampler as v1_sampler
    from vllm.v1.worker.gpu.sample import sampler as v2_sampler

    cases = {}
    for name, params in CASES.items():
        for mode in ("processed_logprobs", "raw_logprobs"):
            cases[f"{name} {mode}"] = _vllm_case(params, mode)
    v2_call = re.sub(r"\s+", " ", inspect.getsource(v2_sampler.Sampler.__call__))
    v2_sample = re.sub(r"\s+", " ", inspect.getsource(v2_sampler.Sampler.sample))
    return {
        "version": vllm_package.__version__,
        "cases": cases,
        # V2 model runner: processed log-probs come from the logits after top-k/top-p, raw
        # ones from the logits it was given (before temperature).
        "v2_processed_after_top_k_top_p": (
            'if self.logprobs_mode == "processed_logprobs": logits = processed_logits'
            in v2_call and "processed_logits = apply_top_k_top_p(processed_logits, top_k, "
            "top_p)" in v2_sample),
        "v2_raw_is_the_input_logits": "compute_topk_logprobs( logits," in v2_call,
        "v1_raw_before_temperature": bool(re.search(
            r'if logprobs_mode == "raw_logprobs": raw_logprobs = self\.compute_logprobs\(logits\)'
            r".*self\.sample\(logits", re.sub(r"\s+", " ", inspect.getsource(
                v1_sampler.Sampler.forward)))),
    }


@contextlib.contextmanager
def _eager():
    """torch.compile off while the samplers run: vLLM compiles its rank count
    (``batched_count_greater_than``, ops/logprobs.py), which the log-probs do not depend on,
    and inductor's CPU build of it takes tens of seconds here and crashes (SIGSEGV in an
    OpenMP thread) under the suite's pinned ``ATEN_CPU_CAPABILITY=avx2``."""
    import torch._dynamo

    saved = torch._dynamo.config.disable
    torch._dynamo.config.disable = True
    try:
        yield
    finally:
        torch._dynamo.config.disable = saved


def run(engine: str) -> dict:
    """The engine's record, or ``{"error": ...}`` (the contract tests show it)."""
    import time

    start = time.monotonic()
    try:
        with _eager():
            record = sglang() if engine == "sglang" else vllm()
        return {**record, "seconds": round(time.monotonic() - start, 2)}
    except Exception as exc:  # noqa: BLE001 - reported, the other contract tests go on
        import traceback

        return {"error": f"{type(exc).__name__}: {exc}",
                "where": traceback.format_exc()[-2000:]}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1]), default=str))
