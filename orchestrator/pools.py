"""Pool catalogue: pool name -> accelerator, node labels, Ray resources, capacity, sim profile.

Hardware is a *pinned* axis: a trial for pool X runs only where X is, never on a substitute.
The built-in catalogue is ``orchestrator/pools.yaml``; a grid may add or replace entries with
``pool_catalog: path/to/pools.yaml`` (same format).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.exceptions import GridError

BUILTIN_CATALOG = Path(__file__).with_name("pools.yaml")


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class PoolSpec(BaseModel):
    """One hardware pool. ``kind: sim`` pools are numeric profiles of the CPU simulator;
    ``kind: cpu`` pools run real verl jobs on this machine's CPU (``gpus_per_node`` GPU-shaped
    devices emulated through Ray resources, one gloo rank each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["sim", "gpu", "cpu"]
    accelerator: str
    description: str = ""
    capacity: int = Field(2, ge=0, le=4096)  # concurrent trials this pool hosts
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
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GridError(f"cannot read pool catalogue ({type(exc).__name__})", file=str(path),
                        fix="give a UTF-8 YAML file with a top-level 'pools:' mapping") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("pools"), dict) or set(raw) != {"pools"}:
        raise GridError("a pool catalogue is a mapping with one key 'pools:'", file=str(path),
                        key="pools", fix="see orchestrator/pools.yaml for the format")
    pools: dict[str, PoolSpec] = {}
    for name, body in raw["pools"].items():
        try:
            pools[str(name)] = PoolSpec(name=str(name), **(body or {}))
        except (ValidationError, TypeError) as exc:
            detail = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc)}
            loc = ".".join(str(p) for p in detail.get("loc", ()))
            raise GridError(detail["msg"], file=str(path),
                            key=f"pools.{name}" + (f".{loc}" if loc else "")) from None
    return PoolCatalog(pools, str(path))


@functools.lru_cache(maxsize=8)
def load_catalog(extra: str | None = None) -> PoolCatalog:
    """The built-in catalogue, merged with ``extra`` (a user's pools.yaml) when given."""
    catalog = _parse_catalog(BUILTIN_CATALOG)
    if extra:
        catalog = catalog.merged(_parse_catalog(Path(extra)))
    return catalog
