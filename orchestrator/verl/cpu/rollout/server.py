"""The CPU rollout server: a Ray actor that verl's agent loops call like its vLLM/SGLang servers.

verl 0.9.1's ``LLMServerClient.generate`` calls ``server.generate.remote(request_id=,
prompt_ids=, sampling_params=, image_data=, video_data=)`` and expects a ``TokenOutput``; the
trainer drives ``sleep`` / ``wake_up`` / kv-cache / abort / profile methods on every replica
(``checkpoint_engine/base.py`` CheckpointEngineManager, ``rollout/replica.py``). This actor
implements generation with :mod:`orchestrator.verl.cpu.rollout.decoding` in ``rollout.dtype``
(``float32`` or ``bfloat16``: the knob behind the project's cpu-fp32 / cpu-bf16 pools), takes
the trainer's weights through :meth:`CpuRolloutServer.update_weights`, and treats the
memory-management calls as no-ops: the KV cache lives only for one request, so there is nothing
to release between phases.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from orchestrator.verl import engine_hook
from orchestrator.verl.cpu.rollout import weights as weight_sync
from orchestrator.verl.cpu.rollout.decoding import SamplingParams, decode

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def server_actor_name(replica_rank: int, kind: str = "", suffix: str = "") -> str:
    """The Ray actor name shared by the replica (which creates it) and the adapter (which finds it)."""
    kind_part = f"{kind}_" if kind else ""
    return f"ablate_cpu_rollout_{kind_part}{replica_rank}{suffix}"


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[str(name).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"rollout dtype {name!r}: the CPU rollout takes {sorted(DTYPES)}") from None


class CpuRolloutServer:
    """One replica's model, served token-in/token-out (wrapped with ``ray.remote`` by the replica)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int,
                 torch_threads: int = 1) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        torch.set_num_threads(max(1, torch_threads))
        self.config = config
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.dtype = torch_dtype(config.dtype)
        attn = (self.model_config.override_config or {}).get("attn_implementation", "sdpa")
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=self.dtype, attn_implementation=attn,
            trust_remote_code=self.model_config.trust_remote_code).eval()
        self.eos_token_ids = _eos_ids(self.model_config)
        self.generator = torch.Generator().manual_seed(int(config.seed) + replica_rank)
        # learner.preset true_on_policy: every request draws from its own generator seeded by
        # the rollout seed, the step and its index among the requests for the same prompt (the
        # sample index of a GRPO group, Miles' sampling_seed = rollout_seed + index), so the
        # samples of a prompt differ and a rerun draws the same set, whatever the arrival order.
        cpu_kwargs = (getattr(config, "engine_kwargs", None) or {}).get("cpu") or {}
        self.per_sample_seed = bool(cpu_kwargs.get("per_sample_seed", False))
        self.seed = int(config.seed)
        self._groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.sync_records: list[weight_sync.SyncRecord] = []
        self._served = [0, 0.0, 0]  # requests, decode seconds, tokens since the last sync
        self.max_model_len = int(config.max_model_len or
                                 self.model_config.hf_config.max_position_embeddings)
        print(f"[cpu-rollout] replica {replica_rank}: {self.model_config.local_path} in {self.dtype}"
              f", attn={attn}, eos={sorted(self.eos_token_ids)}, pid={os.getpid()}", flush=True)
        # Provenance: what this engine runs with, read from the loaded model itself.
        engine_hook.report("cpu", _version(), {
            "dtype": next(self.model.parameters()).dtype, "attention_backend": attn,
            "max_model_len": self.max_model_len,
            "torch_threads": torch.get_num_threads(), "replica": replica_rank})

    # ------------------------------------------------------------------ generation

    async def generate(self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None,
                       **kwargs: Any) -> Any:
        """Decode one request; verl's ``TokenOutput`` with the sampled tokens' log-probs."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or kwargs.get("audio_data"):
            raise NotImplementedError("the CPU rollout serves text-only models")
        prompt = [int(t) for t in (prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else prompt_ids)]
        budget = self.max_model_len - len(prompt) - 1
        if budget < 0:
            raise ValueError(f"prompt of {len(prompt)} tokens exceeds max_model_len "
                             f"{self.max_model_len}")
        default_max = min(self.config.response_length,
                          self.config.prompt_length + self.config.response_length - len(prompt))
        params = SamplingParams.from_verl(sampling_params, default_max_new_tokens=default_max,
                                          eos_token_ids=self.eos_token_ids,
                                          ignore_eos=bool(self.config.ignore_eos))
        if params.max_new_tokens > budget:
            params = SamplingParams(**{**params.__dict__, "max_new_tokens": max(0, budget)})
        started = time.perf_counter()
        group = self._groups.setdefault(tuple(prompt), [])
        generator = self.generator
        if self.per_sample_seed:
            seed = self.seed + 1_000_003 * (self.global_steps or 0) + len(group)
            generator = torch.Generator().manual_seed(seed)
        out = decode(self.model, prompt, params, generator)
        group.append(tuple(out.token_ids))
        self._served[0] += 1
        self._served[1] += time.perf_counter() - started
        self._served[2] += len(out.token_ids)
        return TokenOutput(token_ids=out.token_ids,
                           log_probs=out.log_probs if params.want_logprobs else None,
                           stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": self.global_steps,
                                         "finish_reason": out.finish_reason})

    # ------------------------------------------------------------------ weights

    async def update_weights(self, named_tensors: dict[str, torch.Tensor],
                             global_steps: int | None = None) -> dict[str, Any]:
        """Replace the served weights with the trainer's; returns the sync record as a dict."""
        count, max_change, mean_change = weight_sync.load_weights(self.model, named_tensors)
        if global_steps is not None:
            self.global_steps = global_steps
        groups = [g for g in self._groups.values() if len(g) > 1]
        clones = sum(len(set(g)) == 1 for g in groups)
        record = weight_sync.make_record(self.model, self.replica_rank, global_steps, count,
                                         max_change, mean_change, served=tuple(self._served),
                                         groups=(len(groups), clones),
                                         per_sample_seed=self.per_sample_seed)
        self._served = [0, 0.0, 0]
        self._groups = {}
        self.sync_records.append(record)
        weight_sync.append_record(record)
        return record.__dict__

    async def weight_fingerprint(self) -> float:
        return weight_sync.fingerprint(self.model)

    async def get_sync_records(self) -> list[dict[str, Any]]:
        return [r.__dict__ for r in self.sync_records]

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def ready(self) -> str:
        return f"replica {self.replica_rank} ready ({self.dtype})"

    # ------------------------------------------------------------------ memory / control no-ops

    async def wake_up(self) -> None:
        """Weights stay resident on the CPU; nothing to restore."""

    async def sleep(self) -> None:
        """Nothing to free: the KV cache lives for one request only."""

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Requests run to completion one at a time; there is never one to abort mid-way."""

    async def resume_generation(self) -> None:
        pass

    async def start_profile(self, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass


def _version() -> str:
    """The CPU engine is rl-ablate's own: its version is the package's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"rl-ablate-{version('rl-ablate')}"
    except PackageNotFoundError:
        return "rl-ablate-source"


def _eos_ids(model_config: Any) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer (all of them)."""
    ids: set[int] = set()
    for source in (model_config.generation_config, model_config.hf_config, model_config.tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError(f"no eos_token_id in {model_config.local_path}: the rollout could never stop")
    return ids
