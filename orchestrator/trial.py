"""Trial value objects: the spec of one grid point, its state machine, attempts and paths on disk.

A trial is one resolved configuration (recipe + overrides + pool + seed + backend) identified by
a content hash, so the same configuration always has the same id, whichever grid file, key
order or machine produced it.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from orchestrator.exceptions import UserError

SCHEMA_VERSION = 1


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


class IllegalTransition(RuntimeError):
    """A trial was asked to move between states that have no legal edge."""


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

    @property
    def axis_values(self) -> dict[str, str]:
        return dict(self.axes)

    @property
    def override_map(self) -> dict[str, Any]:
        return dict(self.overrides)

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
            overrides=tuple((str(k), _freeze(v)) for k, v in data["overrides"]),
            derived_from=tuple(data["derived_from"]) if data.get("derived_from") else None,
        )


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def canonical_json(obj: Any) -> str:
    """Key-order independent JSON used for hashing (tuples and lists hash the same)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=list)


def trial_id_for(identity: Mapping[str, Any]) -> str:
    """Content hash of a trial's identity: ``t`` + 12 hex digits of SHA-256."""
    digest = hashlib.sha256(canonical_json(identity).encode()).hexdigest()
    return "t" + digest[:12]


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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


class TrialPaths:
    """Names every file of one trial's directory (``<workdir>/<grid>/trials/<trial_id>/``)."""

    def __init__(self, grid_dir: Path, trial_id: str) -> None:
        self.root = Path(grid_dir) / "trials" / trial_id

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def log(self) -> Path:
        return self.root / "trial.log"

    @property
    def run_lock(self) -> Path:
        """Held (``flock``) by whoever writes the trial's files: its runner for a whole attempt,
        the orchestrator while it sends the trial's MLflow outbox or resets a dead run."""
        return self.root / ".run.lock"


def atomic_write_text(path: Path, write: Callable[[TextIO], None]) -> None:
    """Write a file via temp file + fsync + rename, so readers never see it half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON with a schema version atomically (see :func:`atomic_write_text`)."""
    if isinstance(data, dict) and "schema_version" not in data:
        data = {"schema_version": SCHEMA_VERSION, **data}
    atomic_write_text(path, lambda fh: json.dump(data, fh, indent=1, sort_keys=True, default=list))


class StateFileError(UserError):
    """A durable JSON state file is truncated or garbage: one line naming it and the fix."""


# What removing each file costs: the runner rebuilds a missing state.json as a pending trial
# that resumes from its last verified checkpoint (its MLflow run is found again through the
# trial's outbox, so no step is sent twice).
_FIXES = {
    "state.json": "delete it and submit the grid again; the trial resumes from its last verified "
                  "checkpoint and keeps its MLflow run",
    "attempts.json": "delete it and submit the grid again; metrics and checkpoints are kept, the "
                     "trial's list of earlier attempts is lost",
    "result.json": "delete it; `ablate status` and `ablate compare` read the trial's state instead",
    "spec.json": "delete the trial directory's spec.json and submit the grid again; it is "
                 "rewritten from the grid file",
}


def corrupt_state_file(path: Path, problem: str) -> StateFileError:
    # One message argument, like every UserError: Ray copies and pickles exceptions of workers.
    fix = _FIXES.get(Path(path).name, "restore it from a backup or delete it (the orchestrator "
                                      "rewrites it on the next submit)")
    return StateFileError(f"{path}: corrupt JSON state file ({problem}); fix: {fix}")


def read_json(path: Path) -> Any:
    """Read a JSON state file; a truncated or garbage file raises ``StateFileError`` (a one-line
    ``UserError``, still a ``ValueError``) naming the path and the fix."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise corrupt_state_file(path, f"{exc.msg}: line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise corrupt_state_file(path, "not UTF-8 text") from None


def format_axes(axes: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes)
