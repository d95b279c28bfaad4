"""Loading the trainer's weights into the served model, and the record that proves it happened.

Each sync replaces every parameter of the served model with the trainer's tensor (cast to the
rollout dtype) and records how far the served weights moved. A sync that leaves parameters
unmatched, or brings names the model does not have, raises: a partial load would leave the
rollout sampling from a different policy than the one the trainer believes it has.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import torch

from orchestrator.verl.cpu.envvars import SYNC_LOG_ENV


@dataclass(frozen=True)
class SyncRecord:
    """One weight sync as the server saw it."""

    replica_rank: int
    global_steps: int | None
    n_tensors: int
    max_abs_change: float  # largest |new - old| over all served parameters
    mean_abs_change: float
    fingerprint: float  # sum of |w| over all served parameters (float64)
    dtype: str
    wall_time: float
    # Generation served since the previous sync (the step's rollout phase): verl's timing_s/gen
    # is floored at 2 s by its replay buffer's poll interval, so this is the engine's real cost.
    requests_since_last_sync: int = 0
    decode_seconds_since_last_sync: float = 0.0
    tokens_since_last_sync: int = 0
    # Groups of requests with the same prompt since the previous sync (the n samples of a GRPO
    # prompt), and how many of them came out as clones (every response identical).
    prompt_groups_since_last_sync: int = 0
    clone_groups_since_last_sync: int = 0
    per_sample_seed: bool = False


def fingerprint(model: torch.nn.Module) -> float:
    """A cheap scalar that changes whenever any served weight changes."""
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


@torch.no_grad()
def load_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor] | Iterable[
        tuple[str, torch.Tensor]]) -> tuple[int, float, float]:
    """Copy ``weights`` into ``model`` in place; return (count, max |change|, mean |change|)."""
    items = dict(weights.items() if isinstance(weights, Mapping) else weights)
    params = dict(model.named_parameters())
    unknown = sorted(set(items) - set(params))
    missing = sorted(set(params) - set(items))
    if unknown or missing:
        raise KeyError(f"weight sync does not match the served model: unknown {unknown[:5]} "
                       f"({len(unknown)}), missing {missing[:5]} ({len(missing)})")
    max_change, total_change, numel = 0.0, 0.0, 0
    for name, tensor in items.items():
        target = params[name]
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(f"{name}: trainer sent shape {tuple(tensor.shape)}, served model has "
                             f"{tuple(target.shape)}")
        new = tensor.detach().to(device=target.device, dtype=target.dtype)
        delta = (new.float() - target.float()).abs()
        max_change = max(max_change, float(delta.max()) if delta.numel() else 0.0)
        total_change += float(delta.sum())
        numel += delta.numel()
        target.copy_(new)
    return len(items), max_change, total_change / max(numel, 1)


def append_record(record: SyncRecord) -> None:
    """Print the record and append it to ``$ABLATE_CPU_ROLLOUT_SYNC_LOG`` if that is set."""
    line = json.dumps(asdict(record), sort_keys=True)
    print(f"[cpu-rollout weight sync] {line}", flush=True)
    path = os.environ.get(SYNC_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def make_record(model: torch.nn.Module, replica_rank: int, global_steps: int | None,
                count: int, max_change: float, mean_change: float,
                served: tuple[int, float, int] = (0, 0.0, 0),
                groups: tuple[int, int] = (0, 0), per_sample_seed: bool = False) -> SyncRecord:
    """``served`` = (requests, decode seconds, generated tokens) since the previous sync."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return SyncRecord(replica_rank=replica_rank, global_steps=global_steps, n_tensors=count,
                      max_abs_change=max_change, mean_abs_change=mean_change,
                      fingerprint=fingerprint(model), dtype=dtype, wall_time=time.time(),
                      requests_since_last_sync=served[0],
                      decode_seconds_since_last_sync=round(served[1], 4),
                      tokens_since_last_sync=served[2],
                      prompt_groups_since_last_sync=groups[0],
                      clone_groups_since_last_sync=groups[1], per_sample_seed=per_sample_seed)
