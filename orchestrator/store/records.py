"""Durable per-trial records on disk, shared by the runner, the scheduler and ``ablate status``.

Files of one trial (``TrialPaths``): ``spec.json`` (the TrialSpec), ``state.json`` (TrialState,
MLflow run id, attempt count, verdict, MLflow commit marks), ``attempts.json`` (Attempt list),
``metrics.jsonl`` (one line per step: the source of truth for metrics), ``superseded/attempt-N.jsonl``
(rows attempt N replaced by resuming from an earlier checkpoint). Per grid: ``cancel.json``
(cancel requests by trial id). JSON state is written atomically; the metrics file is append-only
and truncated (atomically) only when a new attempt resumes from an earlier checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.exceptions import StateFileError
from orchestrator.store._cancel import (  # noqa: F401 - part of records' interface
    add_cancel_requests,
    cancel_path,
    cancel_requests,
    clear_cancel_requests,
)
from orchestrator.store._files import (
    TrialPaths,
    atomic_write_json,
    atomic_write_text,
    corrupt_state_file,
    read_json,
)
from orchestrator.trial import Attempt, TrialSpec, TrialState, transition

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ResumeRequest:
    """Why and how a trial's next attempt runs elsewhere: on ``pool``, from checkpoint ``start``
    (a step, or ``"latest"``), because ``reason``. Written by ``ablate resume`` and the automatic
    rescue, consumed (and cleared) by the next attempt; in ``state.json`` as ``resume: {pool,
    start, reason}``."""

    pool: str | None = None
    start: int | str | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResumeRequest:
        return cls(pool=data.get("pool"), start=data.get("start"), reason=data.get("reason"))


@dataclasses.dataclass
class TrialRecord:
    """Mutable view of ``state.json``; save it with :func:`save_state`."""

    trial_id: str
    state: TrialState = TrialState.PENDING
    pool: str | None = None
    mlflow_run_id: str | None = None
    attempts: int = 0
    verdict: dict[str, Any] | None = None
    last_step: int = 0
    committed_step: int = 0  # MLflow holds exactly steps 1..committed_step
    pending_reason: str | None = None
    error: str | None = None
    search: dict[str, Any] | None = None  # Optuna point (params, choices) of a search trial
    resume: ResumeRequest | None = None  # `ablate resume`'s request for the next attempt
    objective: float | None = None
    # MLflow runs this trial's run replaced (a resume before what MLflow held), oldest first.
    superseded_runs: list[str] = dataclasses.field(default_factory=list)
    # The latest automatic rescue of this trial or its refusal: {"event", "entry", "by", "trial",
    # "pool", "start"|"error"}; ``rescues`` holds every one, oldest first (``grid._policy``).
    rescue: dict[str, Any] | None = None
    rescues: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # A trial derived by a rescue: {"parent", "event", "step"} (no rescue of a rescue unless asked).
    rescue_of: dict[str, Any] | None = None
    # What metrics.jsonl held when the trial ended (``store.summary.Stamp``): readers trust it
    # while the file's size and mtime are unchanged instead of parsing the file again.
    metrics_stamp: dict[str, Any] | None = None
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in fields}
        kw["state"] = TrialState(data.get("state", "pending"))
        kw["resume"] = ResumeRequest.from_json(data["resume"]) if data.get("resume") else None
        return cls(**kw)


def _parsed(path: Path, parse: Callable[[Any], T]) -> T:
    """``parse(read_json(path))``; JSON of the wrong shape is as corrupt as garbage."""
    data = read_json(path)
    try:
        return parse(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise corrupt_state_file(path, f"unexpected content: {type(exc).__name__}: {exc}"[:200]) from None


def _foreign(path: Path, what: str, folder: str) -> StateFileError:
    """A record that belongs elsewhere (copied or moved by hand): never read as this trial's."""
    return StateFileError(
        f"{path}: holds the records of {what}, not of trial {folder} whose folder it is in; "
        f"fix: put the file back where it belongs, or delete the folder trials/{folder}/ and "
        "submit the grid again (the trial is rerun from the grid file)")


def load_state(paths: TrialPaths, trial_id: str) -> TrialRecord:
    """The trial's ``state.json`` (a fresh pending record if it has none). A file recording
    another trial's id is refused like a corrupt one (``StateFileError``)."""
    try:
        record = _parsed(paths.state, TrialRecord.from_json)
    except FileNotFoundError:  # one system call, not two: ``ablate status`` reads 1,000s
        return TrialRecord(trial_id=trial_id)
    if record.trial_id != trial_id:
        raise _foreign(paths.state, f"trial {record.trial_id}", trial_id)
    return record


def save_state(paths: TrialPaths, record: TrialRecord) -> None:
    record.updated_at = time.time()
    atomic_write_json(paths.state, record.to_json())


def route_pool(record: TrialRecord, trial: TrialSpec) -> str:
    """The pool the next attempt of a trial runs on: a resume request's, else the last one's."""
    if record.resume is not None and record.resume.pool:
        return str(record.resume.pool)
    return record.pool or trial.pool


def load_spec(paths: TrialPaths) -> TrialSpec | None:
    """The trial's ``spec.json``, or None before it is written. A spec of another trial than
    its folder's is refused (``StateFileError``). (Its grid is not compared with the folder's:
    one configuration has one id in every grid, and a grid's directory may be named apart from
    it, e.g. ``--workdir`` layouts and tests.)"""
    try:
        spec = _parsed(paths.spec, TrialSpec.from_json)
    except FileNotFoundError:
        return None
    if spec.trial_id != paths.root.name:
        raise _foreign(paths.spec, f"trial {spec.trial_id}", paths.root.name)
    return spec


def trial_ids(grid_dir: Path) -> list[str]:
    """Every trial of a grid that has files (derived and search trials included), sorted: the
    trial directories (not hidden) holding a ``spec.json`` file. Strings, not ``Path``s: status
    lists thousands."""
    root = os.path.join(grid_dir, "trials")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return [n for n in names if n[:1] != "." and os.path.isfile(os.path.join(root, n, "spec.json"))]


def known_trials(grid_dir: Path) -> dict[str, TrialSpec]:
    """The spec of every trial of a grid that has files, by trial id (sorted)."""
    out = {}
    for tid in trial_ids(grid_dir):
        spec = load_spec(TrialPaths(grid_dir, tid))
        if spec is not None:
            out[spec.trial_id] = spec
    return out


def save_spec(paths: TrialPaths, trial: TrialSpec) -> None:
    if not paths.spec.exists():
        atomic_write_json(paths.spec, {"schema_version": 1, **trial.to_json()})


def load_attempts(paths: TrialPaths) -> list[Attempt]:
    try:
        return _parsed(paths.attempts, lambda d: [Attempt.from_json(a) for a in d.get("attempts", [])])
    except FileNotFoundError:
        return []


def save_attempts(paths: TrialPaths, attempts: Iterable[Attempt]) -> None:
    atomic_write_json(paths.attempts, {"attempts": [a.to_json() for a in attempts]})


# --------------------------------------------------------------------------- metrics.jsonl


def iter_metrics(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, metrics) rows; a torn line (writer killed mid-line) is skipped (``check_metrics``
    says whether there was one)."""
    if not path.exists():
        return
    with open(path) as fh:
        for line in fh:
            try:
                row = json.loads(line)
                step, values = int(row["step"]), {k: float(v) for k, v in row["metrics"].items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            yield step, values


def truncate_metrics(path: Path, upto: int) -> list[tuple[int, dict[str, float]]]:
    """Keep rows with step <= ``upto`` (atomically) and return them."""
    rows, dropped = [], False
    for s, m in iter_metrics(path):
        if s <= upto:
            rows.append((s, m))
        else:
            dropped = True
    if dropped or not path.exists() or not _ends_with_newline(path):  # a torn line goes too
        write_metrics(path, rows)
    return rows


@dataclasses.dataclass(frozen=True)
class MetricsCheck:
    """What a trial's ``metrics.jsonl`` holds against what its ``state.json`` says it should:
    ``good`` complete rows (steps 1..``good_through`` in order), ``bad_lines`` that are not rows
    (a torn last line when the writer was killed mid-line), ``expected`` steps per the record."""

    path: Path
    good_through: int
    bad_lines: int
    torn_tail: bool  # the file does not end with a newline (cut mid-line)
    expected: int

    @property
    def torn(self) -> bool:
        return self.torn_tail or self.bad_lines > 0

    @property
    def missing(self) -> int:
        return max(self.expected - self.good_through, 0)

    @property
    def ok(self) -> bool:
        return not self.torn and not self.missing

    def describe(self) -> str:
        """One phrase: what is wrong with the file (empty when nothing is)."""
        parts = []
        if self.torn:
            parts.append(f"{self.bad_lines or 1} torn or unreadable line(s)")
        if self.missing:
            parts.append(f"holds steps 1-{self.good_through} of the {self.expected} its state "
                         f"records ({self.missing} missing)")
        return f"{self.path}: " + " and ".join(parts) if parts else ""


def check_metrics(path: Path, expected: int) -> MetricsCheck:
    """Read a metrics file whole and compare it with the ``expected`` last step: every line must
    be a row, the steps must run 1, 2, ... without a gap (a file cut short, or a lost middle,
    shows as missing steps)."""
    return scan_metrics(path, expected)[0]


def scan_metrics(path: Path, expected: int, keys: Iterable[str] = ()
                 ) -> tuple[MetricsCheck, dict[str, list[tuple[int, float]]]]:
    """``check_metrics`` and the (step, value) curves of ``keys`` in the same one pass over the
    file (the rows ``iter_metrics`` yields), so a reader that needs both parses it once."""
    bad = 0
    torn_tail = False
    want = tuple(keys)
    rows: list[tuple[int, list[tuple[str, float]]]] = []
    if path.exists():
        torn_tail = not _ends_with_newline(path)
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    row = json.loads(raw)
                    step = int(row["step"])
                    values = dict(row["metrics"])
                    rows.append((step, [(k, float(values[k])) for k in want if k in values]))
                except (ValueError, KeyError, TypeError):
                    bad += 1
    good, stray = _in_order([step for step, _ in rows])
    curves: dict[str, list[tuple[int, float]]] = {k: [] for k in want}
    for i, (step, picked) in enumerate(rows):
        if i not in stray:
            for k, v in picked:
                curves[k].append((step, v))
    check = MetricsCheck(Path(path), good, bad + len(stray), torn_tail, expected)
    return check, {k: v for k, v in curves.items() if v}


def _in_order(steps: Sequence[int]) -> tuple[int, set[int]]:
    """The last step of the unbroken run 1, 2, ... and the indices of stray rows: a step that
    repeats or goes back, or one that jumps ahead of its neighbours on both sides (a garbage
    line, ``{"step": 9999999}``); rows after a lost one that continue each other are kept."""
    good, stray = 0, set()
    for i, step in enumerate(steps):
        if step == good + 1:
            good = step
        elif step == 0 == good:
            continue
        elif step <= good or not ((i > 0 and steps[i - 1] == step - 1)
                                  or (i + 1 < len(steps) and steps[i + 1] == step + 1)):
            stray.add(i)
    return good, stray


def repair_torn(path: Path) -> int:
    """Drop unreadable lines (a torn last line) and rows out of order (a garbage line, the
    rows after a lost one) from a metrics file atomically, as ``scan_metrics`` counts them;
    returns the number of rows kept."""
    rows = list(iter_metrics(path))
    stray = _in_order([step for step, _ in rows])[1]
    rows = [r for i, r in enumerate(rows) if i not in stray]
    write_metrics(path, rows)
    return len(rows)


def damaged_metrics(grid_dir: Path) -> list[str]:
    """What is wrong with the metrics files of a grid's finished trials, one line each (for the
    readers that only report: ``ablate compare``; an unfinished trial may be mid-rewind)."""
    out = []
    for tid in trial_ids(grid_dir):
        paths = TrialPaths(grid_dir, tid)
        rec = load_state(paths, tid)
        if rec.state.is_finished():
            problem = check_metrics(paths.metrics, rec.last_step).describe()
            if problem:
                out.append(f"trial {tid}: {problem}")
    return out


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return True
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def write_metrics(path: Path, rows: Iterable[tuple[int, Mapping[str, float]]]) -> None:
    """Replace a metrics file with ``rows`` atomically (temp file + fsync + rename)."""
    atomic_write_text(path, lambda fh: fh.writelines(metric_line(s, m) for s, m in rows))


def effective_ranges(attempts: Iterable[Attempt]) -> list[tuple[str, int, int | None]]:
    """(pool, first, last) step ranges each attempt contributes to the trial's one step axis
    (last None while it runs): a later attempt that resumed from an earlier checkpoint replaces
    the steps after that checkpoint."""
    items = list(attempts)
    out: list[tuple[str, int, int | None]] = []
    for i, a in enumerate(items):
        last = a.end_step
        if i + 1 < len(items):
            cut = items[i + 1].start_step - 1
            last = cut if last is None else min(last, cut)
        if last is None or last >= a.start_step:
            out.append((a.pool, a.start_step, last))
    return out


def metric_line(step: int, metrics: Mapping[str, float]) -> str:
    return json.dumps({"step": step, "metrics": {k: float(v) for k, v in metrics.items()}},
                      separators=(",", ":")) + "\n"


def last_metrics(path: Path, max_bytes: int = 65536) -> tuple[int, dict[str, float]] | None:
    """The last complete row of a metrics file, reading only its tail (for live progress): 8 KiB
    first (a row of 40 metrics is about 2 KiB), ``max_bytes`` when that holds no complete row."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            for tail in dict.fromkeys((min(8192, max_bytes), max_bytes)):
                fh.seek(max(0, size - tail))
                lines = fh.read().splitlines()
                if size > tail:
                    lines = lines[1:]  # the first line read is cut
                rows = [r for r in map(_row, reversed(lines)) if r is not None]
                for i, (step, values) in enumerate(rows):  # newest first
                    # A row that does not follow the one before it is garbage (a stray line),
                    # not the trial's step: the newest row that follows its predecessor counts
                    # (a file of one row has nothing to follow).
                    if i + 1 == len(rows) and (step == 1 or size > tail or i == 0) or (
                            i + 1 < len(rows) and rows[i + 1][0] == step - 1):
                        return step, values
    except FileNotFoundError:
        return None
    return None


def _row(raw: bytes) -> tuple[int, dict[str, Any]] | None:
    """One line of a metrics file as (step, metrics), or None for a line that is no row."""
    try:
        row = json.loads(raw)
        step, values = int(row["step"]), row["metrics"]
    except (json.JSONDecodeError, KeyError, ValueError, TypeError):
        return None
    return (step, values) if isinstance(values, dict) else None


def finite_or_none(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# --------------------------------------------------------------------------- the run lock


def run_lock(paths: TrialPaths) -> Any:
    """The trial's ``FileLock`` (see ``TrialPaths.run_lock``); a killed holder releases it."""
    from filelock import FileLock

    paths.root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(paths.run_lock))


# --------------------------------------------------------------------------- results


def stored_result(paths: TrialPaths, record: TrialRecord) -> dict[str, Any]:
    """The result of a finished trial from its files (``result.json`` if the run wrote one)."""
    if paths.result.exists():
        data = dict(read_json(paths.result))
        data["state"] = record.state.value
        return data
    return {"trial_id": record.trial_id, "state": record.state.value, "outcome": record.state.value,
            "last_step": record.last_step, "attempt": record.attempts, "verdict": record.verdict,
            "error": record.error, "summary": {}}


def mark_cancelled(grid_dir: Path, trial_id: str) -> dict[str, Any]:
    """Cancel a trial that is not running (caller holds its lock or knows nobody runs it)."""
    paths = TrialPaths(grid_dir, trial_id)
    record = load_state(paths, trial_id)
    if not record.state.is_finished():
        record.state = transition(record.state, TrialState.CANCELLED)
        record.pending_reason = None
        save_state(paths, record)
    clear_cancel_requests(grid_dir, [trial_id])
    return stored_result(paths, record)
