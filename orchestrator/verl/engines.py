"""``rollout.*`` flags -> verl 0.9.1 keys, one table per rollout engine (SGLang, vLLM).

Each table is plain data: flag -> :class:`Key` (how the flag reaches the engine) or
:class:`Refused` (why this engine cannot express it, with the nearest setting). The file and line
of verl 0.9.1 that carries each key are in ``source`` (research/engines-and-axes.md section 3;
the wheel's ``workers/rollout/{sglang,vllm}_rollout/*_server.py``). The docs helper renders these
tables; :func:`engine_overrides` and :func:`check_engine` are the only code that reads them.

Installed engines are checked by feature, never by a guessed version number: a flag that needs a
newer engine names the marker it looks for in the installed package's source (``FEATURES``).
Nothing here imports an engine; plan time stays fast.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.engine import CUDAGRAPH_MODES, ENGINES, RolloutSpec
from orchestrator.verl.mapping import override
from orchestrator.verl.topology import config_value

ROLLOUT = "actor_rollout_ref.rollout"
SGLANG_KW = f"+{ROLLOUT}.engine_kwargs.sglang"
# Why SGLang's deterministic mode cannot sample a GRPO group: every request without a
# sampling_seed gets seed 42 (the released sglang==0.5.12 wheel, sglang/srt/sampling/
# sampling_batch_info.py:94-108, under enable_deterministic_inference, line 76), and verl's agent
# loop builds its sampling params with none (tests/verl/test_engine_versions.py reads both).
SGLANG_SEED_42 = "srt/sampling/sampling_batch_info.py:94-108"
VERL_NO_SEED = "experimental/agent_loop/agent_loop.py:590-596"
VLLM_KW = f"+{ROLLOUT}.engine_kwargs.vllm"
NAME_KEY = f"{ROLLOUT}.name"
# The pip package (and import name) of each engine.
PACKAGES = {"sglang": "sglang", "vllm": "vllm"}


@dataclass(frozen=True)
class Key:
    """One verl key a flag sets. ``values`` maps the flag's value to verl's (a value missing from
    it sets nothing: the engine default already is that setting); ``None`` passes it through."""

    key: str
    doc: str
    source: str
    values: Mapping[Any, Any] | None = None

    def value_for(self, flag_value: Any) -> tuple[bool, Any]:
        if self.values is None:
            return True, flag_value
        if flag_value in self.values:
            return True, self.values[flag_value]
        return False, None


@dataclass(frozen=True)
class Refused:
    """A flag (or some of its values) this engine cannot express under verl 0.9.1."""

    why: str
    nearest: str
    values: tuple[Any, ...] | None = None  # None: every value; else only these

    def applies(self, flag_value: Any) -> bool:
        return self.values is None or flag_value in self.values


Entry = tuple[Key | Refused, ...]

_DTYPE = Key(f"{ROLLOUT}.dtype", "rollout compute dtype of weights and activations",
             "workers/config/rollout.py:184",
             {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"})
_FP8 = Key(f"{ROLLOUT}.quantization", "fp8 block quantization of the rollout weights (W8A8)",
           "vllm_async_server.py:1209 _apply_quantization / async_sglang_server.py:302",
           {"fp8": "fp8"})
_TEMPERATURE = Key(f"{ROLLOUT}.temperature", "sampling temperature (the actor's log-probs use "
                   "it too)", "workers/config/rollout.py:163")
_FREE_CACHE = Key(f"{ROLLOUT}.free_cache_engine", "release KV cache (and weights) between "
                  "rollout and training (sleep / wake-up)", "vllm_async_server.py:853 sleep; "
                  "async_sglang_server.py:505 release_memory_occupation")
_MAX_SEQS = Key(f"{ROLLOUT}.max_num_seqs", "concurrent sequences per engine step (batch "
                "composition; 1 serialises)", "vllm_async_server.py:333 max_num_seqs; "
                "async_sglang_server.py:329 max_running_requests")
_WEIGHT_LAG = Refused(
    "verl's sync trainer pushes weights to the engine every step; a lag needs verl's "
    "separate_async trainer (trainer.v1.*), which is not mapped", "rollout.weight_lag: 0 (or "
    "the sim backend)", values=tuple(range(1, 65)))
_REDUCTION = Refused("the engine has no switch for the reduction order (a sim-backend emulation)",
                     "drop rollout.reduction_order for verl", values=("reversed", "chunked"))
_SEED_PER_REQUEST = Refused(
    "a per-request sampling seed is needed and verl 0.9.1's agent loop sends none", "drop "
    "rollout.sampling_seed_per_request for verl (the sim backend emulates it)", values=(True,))

# ------------------------------------------------------------------------------- SGLang
SGLANG: dict[str, Entry] = {
    "dtype": (_DTYPE, _FP8),
    "temperature": (_TEMPERATURE,),
    "enforce_eager": (Key(f"{ROLLOUT}.enforce_eager", "no CUDA graphs (SGLang "
                          "disable_cuda_graph)", "async_sglang_server.py:318"),),
    "free_cache_engine": (_FREE_CACHE,),
    "lm_head_fp32": (Key(f"{SGLANG_KW}.enable_fp32_lm_head", "LM head and logits in fp32",
                         "async_sglang_server.py:340 **engine_kwargs"),),
    "kv_cache_dtype": (Key(f"{SGLANG_KW}.kv_cache_dtype", "KV-cache dtype (auto = the rollout "
                           "dtype)", "async_sglang_server.py:340 **engine_kwargs",
                           {"fp8": "fp8_e4m3", "fp32": "auto", "bf16": "auto", "fp16": "auto"}),),
    "attention_backend": (Key(f"{SGLANG_KW}.attention_backend", "attention kernels (verl "
                              "default: flashinfer for sglang>=0.5.12, else fa3)",
                              "async_sglang_server.py:277"),),
    "chunked_prefill": (Key(f"{SGLANG_KW}.chunked_prefill_size", "prefill in chunks (-1: off; "
                            "verl's enable_chunked_prefill never reaches SGLang)",
                            "async_sglang_server.py:340 **engine_kwargs", {False: -1}),),
    "deterministic": (
        Refused("SGLang's deterministic / rl_on_policy_target mode samples every request with "
                "seed 42 unless it carries a sampling_seed (SGLang 0.5.12 "
                f"{SGLANG_SEED_42}), and verl 0.9.1 sends none ({VERL_NO_SEED}): all "
                "rollout.n samples of a prompt come out identical and every GRPO advantage is 0", "drop rollout.deterministic for verl (the "
                "sim backend emulates true on-policy rollouts)", values=(True,)),
        Key(f"{SGLANG_KW}.enable_deterministic_inference", "deterministic inference off",
            "async_sglang_server.py:340 **engine_kwargs", {False: False})),
    "weight_lag": (_WEIGHT_LAG,),
    "reduction_order": (_REDUCTION,),
    "sampling_seed_per_request": (_SEED_PER_REQUEST,),
    "prefix_caching": (Key(f"{SGLANG_KW}.disable_radix_cache", "prefix (radix) cache; verl's "
                           "enable_prefix_caching never reaches SGLang",
                           "async_sglang_server.py:340 **engine_kwargs",
                           {True: False, False: True}),),
    "logprobs_mode": (Refused(
        "verl 0.9.1 passes logprobs_mode to vLLM only (vllm_async_server.py:338); SGLang returns "
        "the log-probs of the processed distribution", "rollout.temperature: 1.0 (processed and "
        "raw log-probs coincide at temperature 1 with top_p 1 and top_k -1), or rollout.engine: "
        "vllm", values=("raw",)),),
    "cudagraph_mode": (Refused(
        "SGLang has CUDA graphs on or off, no vLLM cudagraph modes", "rollout.enforce_eager: true "
        "(no graphs) or false (SGLang's graphs), or rollout.engine: vllm"),),
    "async_scheduling": (Key(f"{SGLANG_KW}.disable_overlap_schedule", "SGLang's overlap "
                             "scheduler, its counterpart of vLLM's async scheduling (CPU "
                             "scheduling overlapped with the GPU step)",
                             "async_sglang_server.py:340 **engine_kwargs",
                             {True: False, False: True}),),
    "max_num_seqs": (_MAX_SEQS,),
}

# ------------------------------------------------------------------------------- vLLM
VLLM_ATTENTION = {"fa3": "FLASH_ATTN", "flashinfer": "FLASHINFER", "triton": "TRITON_ATTN"}
VLLM: dict[str, Entry] = {
    "dtype": (_DTYPE, _FP8),
    "temperature": (_TEMPERATURE,),
    "enforce_eager": (Key(f"{ROLLOUT}.enforce_eager", "no CUDA graphs, no torch.compile",
                          "vllm_async_server.py:339"),),
    "free_cache_engine": (_FREE_CACHE,),
    "lm_head_fp32": (Key(f"{VLLM_KW}.hf_overrides", "LM head in fp32 (vLLM head_dtype; a generative model from vLLM 0.32 on, PR "
                         "#48390); replaces the hf_overrides verl builds for fp8",
                         "vllm_async_server.py:346-349 (**engine_kwargs last)",
                         {True: {"head_dtype": "float32"}}),),
    "kv_cache_dtype": (Key(f"{VLLM_KW}.kv_cache_dtype", "KV-cache dtype (auto = the rollout "
                           "dtype)", "vllm_async_server.py:349 **engine_kwargs",
                           {"fp8": "fp8_e4m3", "fp32": "auto", "bf16": "auto", "fp16": "auto"}),),
    "attention_backend": (
        Refused("vLLM has no torch-native attention backend for decoder models on GPU",
                "rollout.attention_backend: triton (vLLM TRITON_ATTN) or flashinfer",
                values=("torch_native",)),
        Key(f"{VLLM_KW}.attention_backend", "attention backend (fa3 = FLASH_ATTN, which runs FA3 "
            "on Hopper)", "vllm_async_server.py:349 **engine_kwargs", VLLM_ATTENTION)),
    "chunked_prefill": (Key(f"{ROLLOUT}.enable_chunked_prefill", "prefill in chunks",
                            "vllm_async_server.py:334"),),
    "deterministic": (
        Refused("verl 0.9.1's vLLM full_determinism gives every request of a replica the same "
                "seed (vllm_async_server.py:626, seed = replica_rank + rollout.seed), so the "
                "rollout.n samples of a prompt come out identical and every GRPO advantage is 0; "
                "it also needs the V0 trainer", "rollout.max_num_seqs: 1 (one sequence per step: "
                "no batch-composition effects) or the sim backend", values=(True,)),
        Key(f"{ROLLOUT}.full_determinism", "batch-invariant mode off (verl default)",
            "vllm_async_server.py:149", {False: False})),
    "weight_lag": (_WEIGHT_LAG,),
    "reduction_order": (_REDUCTION,),
    "sampling_seed_per_request": (_SEED_PER_REQUEST,),
    "prefix_caching": (Key(f"{ROLLOUT}.enable_prefix_caching", "prefix caching (verl default "
                           "on)", "vllm_async_server.py:336"),),
    "logprobs_mode": (Key(f"{ROLLOUT}.logprobs_mode", "log-probs before (raw) or after "
                          "(processed) temperature and top-k/top-p", "vllm_async_server.py:338",
                          {"processed": "processed_logprobs", "raw": "raw_logprobs"}),),
    "cudagraph_mode": (Key(f"{VLLM_KW}.compilation_config", "CUDA graph mode (verl default "
                           "FULL_AND_PIECEWISE); a JSON string verl parses",
                           "vllm_async_server.py:307-310",
                           {m: json.dumps({"cudagraph_mode": m.upper()}) for m in CUDAGRAPH_MODES}),),
    "async_scheduling": (Key(f"{VLLM_KW}.async_scheduling", "schedule step n+1 while step n "
                             "runs", "vllm_async_server.py:349 **engine_kwargs"),),
    "max_num_seqs": (_MAX_SEQS,),
}

TABLES: dict[str, dict[str, Entry]] = {"sglang": SGLANG, "vllm": VLLM}

# flag -> (files in the installed package, text one of them has when the feature is applied, what
# it is): checked when the engine is installed on the planning machine. The file is the one that
# APPLIES the feature, not the one that parses it: vLLM 0.24.0's config/model.py already has
# head_dtype (for pooling models only; a generative model falls back with a warning), while the
# logits processor that computes the LM head in fp32 (model_executor/layers/logits_processor.py)
# has it only in later releases. A path may be a glob: SGLang's server_args.py moved in releases
# after 0.5.12, so every server_args*.py under srt/ is read.
_SGLANG_ARGS = ("srt/server_args.py", "srt/**/server_args*.py", "srt/**/server_args/*.py")
FEATURES: dict[str, dict[str, tuple[tuple[str, ...], str, str]]] = {
    "vllm": {
        "lm_head_fp32": (("model_executor/layers/logits_processor.py",), "head_dtype",
                         "head_dtype applied to a generative model's LM head"),
        "attention_backend": (("engine/arg_utils.py",), "attention_backend",
                              "--attention-backend"),
        "async_scheduling": (("engine/arg_utils.py",), "async_scheduling", "--async-scheduling"),
        "cudagraph_mode": (("config/compilation.py",), "cudagraph_mode",
                           "compilation_config.cudagraph_mode"),
    },
    "sglang": {
        "lm_head_fp32": (_SGLANG_ARGS, "enable_fp32_lm_head", "--enable-fp32-lm-head"),
        "async_scheduling": (_SGLANG_ARGS, "disable_overlap_schedule",
                             "--disable-overlap-schedule"),
        "prefix_caching": (_SGLANG_ARGS, "disable_radix_cache", "--disable-radix-cache"),
    },
}



# --------------------------------------------------------------------------- mapping


def engine_of(rollout: RolloutSpec, config: Mapping[str, Any] | None) -> str | None:
    """The trial's engine: ``rollout.engine``, else the recipe's ``rollout.name``."""
    if rollout.engine is not None:
        return rollout.engine
    return config_value(config or {}, NAME_KEY) if config is not None else None


def check_engine(rollout: RolloutSpec, engine: str,
                 table: Mapping[str, Entry] | None = None) -> str | None:
    """Why ``engine`` under verl 0.9.1 cannot express these flags, or None (GPU pools; a cpu
    pool's vLLM passes its own ``table``, ``cpu_engines.CPU_VLLM``)."""
    if engine not in TABLES:
        return (f"{NAME_KEY}: {engine!r} is not a rollout engine of the verl backend on gpu "
                f"pools; fix: rollout.engine: one of {', '.join(ENGINES)}")
    table = TABLES[engine] if table is None else table
    for flag, value in rollout.requested().items():
        for entry in table.get(flag, ()):
            if isinstance(entry, Refused) and entry.applies(value):
                return (f"rollout.{flag}: {_show(value)} cannot be expressed on {engine}: "
                        f"{entry.why}; nearest: {entry.nearest}")
    return _cross_checks(rollout, engine)


def _cross_checks(r: RolloutSpec, engine: str) -> str | None:
    """Combinations one key cannot carry."""
    if r.kv_cache_dtype not in (None, "fp8") and r.kv_cache_dtype != (r.dtype or "bf16"):
        return (f"rollout.kv_cache_dtype: {r.kv_cache_dtype}: {engine}'s kv_cache_dtype takes "
                f"auto (= the rollout dtype, {r.dtype or 'bf16'}) or fp8; nearest: "
                f"rollout.kv_cache_dtype: {r.dtype or 'bf16'} or fp8")
    if engine == "vllm" and r.lm_head_fp32 and r.dtype == "fp8":
        return ("rollout.lm_head_fp32 with rollout.dtype: fp8 on vllm: the head_dtype "
                "hf_overrides would replace the quantization_config verl puts in hf_overrides "
                "for fp8 (vllm_async_server.py:1257); nearest: drop one of them")
    if engine == "vllm" and r.enforce_eager and r.cudagraph_mode not in (None, "none"):
        return (f"rollout.cudagraph_mode: {r.cudagraph_mode} with rollout.enforce_eager: true "
                "(eager mode captures no graphs); nearest: rollout.cudagraph_mode: none")
    return None


def engine_overrides(rollout: RolloutSpec, engine: str,
                     table: Mapping[str, Entry] | None = None) -> list[str]:
    """``key=value`` overrides of the flags (call :func:`check_engine` first)."""
    out = [override(NAME_KEY, engine)] if rollout.engine is not None else []
    for flag, value in rollout.requested().items():
        for entry in (TABLES[engine] if table is None else table).get(flag, ()):
            if isinstance(entry, Key):
                emit, verl_value = entry.value_for(value)
                if emit:
                    out.append(override(entry.key, _plain(verl_value)))
    return out


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, float) else value


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --------------------------------------------------------------------------- log-prob semantics

# The rollout log-probs every correction and mismatch metric compares with the trainer's. verl's
# trainer recomputes log_softmax(logits / temperature) over the full vocabulary
# (verl/workers/engine/fsdp/transformer_impl.py:103 and :1522), while the engine samples with
# the rollout's top_p / top_k (verl/experimental/agent_loop/agent_loop.py:590-593). Each engine
# fact below is checked by running the installed engine's own sampler on small logits
# (tests/verl/logprob_semantics_probe.py, tests/verl/test_engine_contract.py).
# vLLM 0.24.0: verl passes logprobs_mode (default processed_logprobs,
# verl/workers/config/rollout.py:197) to the engine (vllm_async_server.py:338); processed_logprobs
# is the log_softmax *after* apply_top_k_top_p (vllm/v1/sample/ops/topk_topp_sampler.py:135-140,
# the path taken whenever processed log-probs are asked for, :86-95; the V2 model runner's
# vllm/v1/worker/gpu/sample/sampler.py:104-106 and :234 alike), renormalised over the nucleus S,
# so each ratio carries log P(S) that is no engine mismatch (vLLM #42259, verl #6240);
# raw_logprobs is taken before temperature and truncation (vllm/v1/sample/sampler.py:84-88),
# which equals the trainer's only at temperature 1.
# SGLang 0.5.12: verl passes it no logprobs_mode and sets neither SGLANG_RETURN_ORIGINAL_LOGPROB
# nor rl_on_policy_target; Sampler.forward returns log(softmax(logits / T)) over the full
# vocabulary, taken before sampling's top-k / top-p filter, on either sampling backend
# (sglang/srt/layers/sampler.py:171-185): the trainer's distribution at any top_p, top_k and
# temperature (the tokens still come from the nucleus, which no ratio then sees).
# SGLANG_RETURN_ORIGINAL_LOGPROB, read at import (sampler.py:52), swaps in log_softmax(logits)
# before temperature (sampler.py:136-137, :190-191): the trainer's only at temperature 1, so a
# pool whose verl_env sets it is refused at any other temperature. (Until this was checked
# against the code, top_p / top_k on SGLang were refused as nucleus-renormalised, a misreading
# in research/verl-0.9.1.md:280, :460.)
# The CPU rollout engine computes the full-vocabulary log-prob (verl/cpu/rollout/decoding.py).
TOP_P_KEY, TOP_K_KEY = f"{ROLLOUT}.top_p", f"{ROLLOUT}.top_k"
LOGPROBS_KEY, TEMPERATURE_KEY = f"{ROLLOUT}.logprobs_mode", f"{ROLLOUT}.temperature"
VERL_LOGPROBS_DEFAULT = "processed_logprobs"
SGLANG_ORIGINAL_LOGPROB = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def logprob_problem(engine: str, *, top_p: Any, top_k: Any, temperature: Any,
                    logprobs_mode: Any, engine_env: Mapping[str, Any] | None = None,
                    ) -> tuple[str, str] | None:
    """(key, why) when ``engine``'s rollout log-probs are not the distribution verl's trainer
    recomputes (a log(S) or temperature term in every IS ratio and k3), or None: vLLM 0.24.0's
    and SGLang 0.5.12's samplers, as the comment above reads them. ``engine_env``: the
    variables the job's engine starts with (the pool's ``verl_env``)."""
    truncated = [f"{key}: {value}" for key, value, cut in (
        (TOP_P_KEY, top_p, isinstance(top_p, (int, float)) and top_p < 1),
        (TOP_K_KEY, top_k, isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0))
        if cut]
    unit = temperature in (None, 1, 1.0)
    if engine == "vllm":
        mode = logprobs_mode or VERL_LOGPROBS_DEFAULT
        if mode not in ("processed_logprobs", "raw_logprobs"):
            return LOGPROBS_KEY, (f"{LOGPROBS_KEY}: {mode}: vLLM then returns logits, not "
                                  "log-probs; fix: rollout.logprobs_mode: processed or raw")
        if mode == "raw_logprobs" and not unit:
            return LOGPROBS_KEY, (
                f"{LOGPROBS_KEY}: raw_logprobs at temperature {temperature}: vLLM takes raw "
                "log-probs before temperature scaling while verl's trainer divides the logits by "
                "it, so every ratio carries the temperature, not the engine; fix: "
                "rollout.logprobs_mode: processed (or temperature 1.0)")
        if truncated and mode == "processed_logprobs":
            fix = ("rollout.logprobs_mode: raw" if unit else "temperature 1.0 with "
                   "rollout.logprobs_mode: raw")
            return truncated[0].split(":")[0], (
                f"{truncated[0]} on vllm: verl passes vLLM's processed_logprobs, renormalised "
                "over the top-p/top-k nucleus, while its trainer recomputes over the full "
                "vocabulary, so k3, the IS ratios and every correction carry a log(S) term that "
                f"is not engine mismatch; fix: top_p 1.0 and top_k -1, or {fix}")
    elif engine == "sglang" and not unit and _env_true((engine_env or {}).get(SGLANG_ORIGINAL_LOGPROB)):
        return TEMPERATURE_KEY, (
            f"{TEMPERATURE_KEY}: {temperature} on sglang with {SGLANG_ORIGINAL_LOGPROB} set: "
            "SGLang then returns log-probs before temperature scaling (sglang/srt/layers/"
            "sampler.py:136-137) while verl's trainer divides the logits by it, so every ratio "
            f"carries the temperature, not the engine; fix: unset {SGLANG_ORIGINAL_LOGPROB} in "
            "the pool's verl_env, or temperature 1.0")
    return None


def _env_true(value: Any) -> bool:
    """SGLang's reading of a boolean variable (``get_bool_env_var``: "true" or "1")."""
    return str(value).strip().lower() in ("true", "1")


# --------------------------------------------------------------------------- installed engines


def installed(engine: str) -> str | None:
    """The installed version of ``engine``'s package on this machine, or None."""
    try:
        return importlib.metadata.version(PACKAGES[engine])
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir(engine: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(PACKAGES[engine])
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _feature_text(root: Path, patterns: tuple[str, ...]) -> str:
    """The text of every file under ``root`` matching one of ``patterns`` (globs allowed)."""
    texts = []
    for pattern in patterns:
        paths = sorted(root.glob(pattern)) if "*" in pattern else [root / pattern]
        for path in paths:
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                continue
    return "\n".join(texts)


def check_installed(rollout: RolloutSpec, engine: str) -> tuple[str | None, str | None]:
    """(refusal, warning) about the engine installed on the planning machine.

    Not installed: a warning (the cluster's image has it). Installed without a feature a
    requested flag needs: a refusal naming the flag, the marker looked for and the fix.
    """
    version = installed(engine)
    root = _package_dir(engine)
    if version is None or root is None:
        return None, (f"{engine} is not installed on this machine; the gpu pool's image must "
                      f"have it (ablate gpu-env {engine}: the {engine} stack from its lock)")
    for flag in rollout.requested():
        feature = FEATURES.get(engine, {}).get(flag)
        if feature is None:
            continue
        rels, marker, what = feature
        if marker not in _feature_text(root, rels):
            return (f"rollout.{flag}: the installed {engine} {version} has no {what} ({marker!r} "
                    f"not found in {PACKAGES[engine]}/{rels[0]}); fix: upgrade {engine} "
                    f"(pip install -U {PACKAGES[engine]}) or drop rollout.{flag}"), None
    return None, None


def table_rows() -> list[tuple[str, str, str]]:
    """(flag, sglang, vllm) rows of the flag x engine -> key table (docs and tests)."""
    def cell(entries: Entry) -> str:
        parts = []
        for e in entries:
            if isinstance(e, Key):
                vals = "" if e.values is None else " (" + ", ".join(
                    f"{_show(k)}->{_show(v)}" for k, v in e.values.items()) + ")"
                parts.append(f"`{e.key}`{vals}")
            else:
                which = "" if e.values is None else " " + "/".join(_show(v) for v in e.values[:3])
                parts.append(f"refused{which}: nearest {e.nearest}")
        return "; ".join(parts) or "-"
    flags = [f for f in RolloutSpec.model_fields if f not in ("engine", "provenance")]
    return [(f, cell(SGLANG.get(f, ())), cell(VLLM.get(f, ()))) for f in flags]
