"""Pool catalogue: pool name -> accelerator, node labels, Ray resources, capacity, sim profile.

Hardware is a *pinned* axis: a trial for pool X runs only where X is, never on a substitute.
The built-in catalogue is ``orchestrator/pools.yaml``; a grid may add or replace entries with
``pool_catalog: path/to/pools.yaml`` (same format). A trial id covers its pool's definition
(``PoolSpec.identity``), so a replaced entry that computes differently gives new ids.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import load_yaml

BUILTIN_CATALOG = Path(__file__).with_name("pools.yaml")
# A pool name becomes Kubernetes labels and names, Ray resource names and command arguments:
# an RFC 1123 label (what Kubernetes accepts as a name and a label value).
POOL_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


# Per kind, the fields that decide a trial's numbers. sim: the simulator's numeric profile (its
# accelerator is only a label). cpu: verl on this machine (the job's overrides, environment and
# world size). gpu: the hardware the node labels select, the container image, the world size.
IDENTITY_FIELDS: dict[str, tuple[str, ...]] = {
    "sim": ("kind", "sim_profile"),
    "cpu": ("kind", "gpus_per_node", "nodes", "cpus_per_node", "verl_overrides", "verl_env"),
    "gpu": ("kind", "accelerator", "node_labels", "ray_accelerator_type", "gpus_per_node", "nodes",
            "image", "verl_overrides", "verl_env"),
}


class PoolSpec(BaseModel):
    """One hardware pool. ``kind: sim`` pools are numeric profiles of the CPU simulator;
    ``kind: cpu`` pools run real verl jobs on this machine's CPU (``gpus_per_node`` GPU-shaped
    devices emulated through Ray resources, one gloo rank each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["sim", "gpu", "cpu"]
    accelerator: str
    description: str = ""
    # Concurrent trials this pool hosts; 0 would leave its trials waiting for ever.
    capacity: int = Field(2, ge=1, le=4096)
    # Planning estimate of one trial's wall seconds per training step here: budgets project a
    # trial's cost from it until trials on the pool have measured their own (orchestrator.cost).
    step_seconds: float | None = Field(None, gt=0, le=1e6)
    # Simulator numerics (kind: sim). Interpreted and validated by the sim backend.
    sim_profile: dict[str, Any] = Field(default_factory=dict)
    # Cluster placement (kind: gpu).
    node_labels: dict[str, str] = Field(default_factory=dict)
    gpus_per_node: int = Field(0, ge=0, le=64)
    nodes: int = Field(1, ge=1, le=1024)
    tolerations: tuple[Toleration, ...] = ()
    kueue_flavor: str | None = None
    ray_accelerator_type: str | None = None
    image: str | None = None
    cpus_per_node: int = Field(0, ge=0, le=1024)
    memory_per_node: str | None = None
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

    def identity(self) -> dict[str, Any]:
        """What this pool's trials compute with (part of every trial id): the fields of
        ``IDENTITY_FIELDS`` for its kind. Scheduling fields (capacity, step_seconds,
        tolerations, kueue_flavor, description) place a trial, they do not change its numbers."""
        data = self.model_dump(mode="json")
        return {k: data[k] for k in IDENTITY_FIELDS[self.kind]}

    @property
    def ray_resource(self) -> str:
        """The Ray custom resource that marks nodes of this pool in the embedded cluster."""
        return f"pool:{self.name}"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


class PoolCatalog:
    """Pools by name, with did-you-mean lookups."""

    def __init__(self, pools: dict[str, PoolSpec], source: str) -> None:
        self.pools = pools
        self.source = source
        self._identities: dict[str, dict[str, Any]] = {}

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
        return PoolCatalog({**self.pools, **other.pools}, f"{self.source} + {other.source}")


def _parse_catalog(path: Path) -> PoolCatalog:
    file = str(path)
    # A regular file under the byte cap, no bombs, decimal numbers; merge keys share settings.
    raw, lines = load_yaml(path, merge=True)
    if not isinstance(raw.get("pools"), dict) or set(raw) != {"pools"}:
        raise GridError("a pool catalogue is a mapping with one key 'pools:'", file=file,
                        line=1, key="pools", fix="see orchestrator/pools.yaml for the format")
    pools: dict[str, PoolSpec] = {}
    for name, body in raw["pools"].items():
        line = lines.get(("pools", name))
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
    return PoolCatalog(pools, file)


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
