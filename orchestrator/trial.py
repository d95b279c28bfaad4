"""Trial value objects: the spec of one grid point, its state machine and its attempts.

A trial is one resolved configuration (recipe + overrides + pool + seed + backend) identified by
a content hash, so the same configuration always has the same id, whichever grid file, key
order or machine produced it.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from orchestrator.exceptions import IllegalTransition


class TrialState(enum.Enum):
    """Lifecycle of a trial. Legal moves are in ``_TRANSITIONS``; use :func:`transition`."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"  # ran to its end or was stopped early; the verdict says how it went
    FAILED = "failed"  # infra failures exhausted the retries
    CANCELLED = "cancelled"

    def is_finished(self) -> bool:
        return self in (TrialState.DONE, TrialState.FAILED, TrialState.CANCELLED)


_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    # PENDING -> FAILED: a trial queued for retry after an infra failure has no retries left.
    TrialState.PENDING: frozenset({TrialState.RUNNING, TrialState.CANCELLED, TrialState.FAILED}),
    # RUNNING -> PENDING: an infra failure queued for retry, or an orchestrator restart.
    TrialState.RUNNING: frozenset(
        {TrialState.PENDING, TrialState.DONE, TrialState.FAILED, TrialState.CANCELLED}
    ),
    # Finished trials only move again through an explicit `ablate resume`.
    TrialState.DONE: frozenset({TrialState.PENDING}),
    TrialState.FAILED: frozenset({TrialState.PENDING}),
    TrialState.CANCELLED: frozenset({TrialState.PENDING}),
}


def transition(current: TrialState, new: TrialState, *, resume: bool = False) -> TrialState:
    """Return ``new`` if ``current -> new`` is legal; finished -> pending needs ``resume=True``."""
    if new not in _TRANSITIONS[current]:
        raise IllegalTransition(f"trial state {current.value} -> {new.value} is not allowed")
    if current.is_finished() and not resume:
        raise IllegalTransition(f"trial is {current.value}; only `ablate resume` may reopen it")
    return new


@dataclasses.dataclass(frozen=True, slots=True)
class TrialSpec:
    """One resolved grid point.

    ``axes`` holds the axis labels as the user wrote them (for tables); ``overrides`` holds the
    dotted-key values applied on top of the recipe after normalisation (for running and hashing).
    """

    trial_id: str
    grid: str
    backend: str
    recipe: str
    pool: str
    seed: int
    steps: int
    axes: tuple[tuple[str, str], ...]
    overrides: tuple[tuple[str, Any], ...]
    derived_from: tuple[str, int] | None = None
    # Content hash of everything the id covers but the seed (``config_id``): trials with one
    # config are the seeds of one cell. "" in specs written before it existed.
    config: str = ""

    @property
    def axis_values(self) -> dict[str, str]:
        return dict(self.axes)

    @property
    def override_map(self) -> dict[str, Any]:
        # Thawed: a mapping value (correction.rs_filters, e.g. from a preset) is held as sorted
        # pairs and must reach the recipe as a mapping again, not a list of pairs.
        return {k: thaw(v) for k, v in self.overrides}

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (the edge format for state files, Ray configs and MLflow)."""
        data = dataclasses.asdict(self)
        data["axes"] = [list(a) for a in self.axes]
        data["overrides"] = [[k, v] for k, v in self.overrides]
        data["derived_from"] = list(self.derived_from) if self.derived_from else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialSpec:
        return cls(
            trial_id=data["trial_id"],
            grid=data["grid"],
            backend=data["backend"],
            recipe=data["recipe"],
            pool=data["pool"],
            seed=int(data["seed"]),
            steps=int(data["steps"]),
            axes=tuple((str(k), str(v)) for k, v in data["axes"]),
            overrides=tuple((str(k), freeze(v)) for k, v in data["overrides"]),
            derived_from=tuple(data["derived_from"]) if data.get("derived_from") else None,
            config=str(data.get("config") or ""),
        )


def freeze(value: Any) -> Any:
    """The hashable form of an override value (how ``TrialSpec.overrides`` holds it): lists
    become tuples, mappings sorted tuples of (key, value) pairs, recursively."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    return value


def thaw(value: Any) -> Any:
    """The plain form of a frozen value again (what recipes and pydantic models take)."""
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) and len(v) == 2
                                                  and isinstance(v[0], str) for v in value):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def canonical_json(obj: Any) -> str:
    """Key-order independent JSON used for hashing (tuples and lists hash the same)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=list)


# Which fields a trial id covers. 1: the pool by name only; 2: also the pool's definition
# (``PoolSpec.identity``). A workdir recorded under an older scheme is refused by ``ablate
# submit`` with the fix (``scheduler/_identity.py``): its ids would not match the new ones.
ID_SCHEME = 2


def trial_id_for(identity: Mapping[str, Any]) -> str:
    """Content hash of a trial's identity: ``t`` + 12 hex digits of SHA-256."""
    return _content_id(canonical_json(identity))


def config_id(identity: Mapping[str, Any]) -> str:
    """Content hash of a trial's identity without its seed: ``c`` + 12 hex digits."""
    rest = {k: v for k, v in identity.items() if k != "seed"}
    return "c" + _content_id(canonical_json(rest))[1:]


_SEED_SENTINEL = -987654321


def seeded_trial_ids(identity: Mapping[str, Any], seeds: Iterable[int]) -> Iterator[tuple[int, str]]:
    """``(seed, trial_id_for({**identity, "seed": seed}))`` for each seed, serialising the
    identity once: its canonical JSON with a sentinel seed, patched per seed, is the same text
    ``trial_id_for`` hashes (a 100,000-trial grid has few distinct identities and many seeds)."""
    template = canonical_json({**identity, "seed": _SEED_SENTINEL})
    marker = f'"seed":{_SEED_SENTINEL}'
    for seed in seeds:
        yield seed, _content_id(template.replace(marker, f'"seed":{seed}'))


def _content_id(text: str) -> str:
    return "t" + hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a trial on one pool over a step range (recorded in attempts.json and MLflow)."""

    number: int
    pool: str
    start_step: int
    end_step: int | None = None
    outcome: str | None = None  # completed | stopped_early | numeric_failure | infra_failure | cancelled
    reason: str | None = None
    resumed_from_step: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    node: str | None = None
    submission: str | None = None  # orchestrator submission that ran it (tells a killed
    # orchestrator from a killed worker when an attempt ended without a record)
    environment: dict[str, str] | None = None  # where it computed (``numerics.*`` facts)
    # What the attempt holds while it runs, for its cost (``orchestrator.cost``): the pool's
    # accelerators per trial and the unit of their hours (gpu_hours | cpu_hours).
    accelerators: int | None = None
    unit: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})
