"""The on-disk outbox of one trial's MLflow run: metrics, tags and artifacts not yet sent.

Everything a ``TrialRun`` logs goes here first, then to MLflow. Each metric row keeps the
timestamp it was buffered with, so re-sending a row the store already has (the server committed
but the reply was lost) writes the identical (key, value, timestamp, step) point, which MLflow's
SQL store drops as a duplicate. ``through_step`` is the last step known to be in the store;
rows at or below it are never buffered again.

Layout of ``buffer_dir``: ``run.json`` (run id, the token its creation is tagged with, through_step,
pending end status), ``pending.jsonl``
(metric rows), ``tags.json`` (pending tags), ``artifacts/`` (files to upload).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.store import atomic_write_json, read_json


class Outbox:
    """Durable state of the not-yet-sent part of one run (single writer: the trial's runner)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "artifacts").mkdir(exist_ok=True)
        state = read_json(self._state_path) if self._state_path.exists() else {}
        self.run_id: str | None = state.get("run_id")
        self.through_step: int = int(state.get("through_step", 0))
        self.end_status: str | None = state.get("end_status")
        self.params_logged: bool = bool(state.get("params_logged", False))
        # Written before the run is created and tagged on it: a process killed after the store
        # created the run but before this file named it leaves the run findable (``_runs``).
        self.creation_token: str | None = state.get("creation_token")
        # Wall-clock ms of the run's real start and end: a run created later (a deferred attempt
        # sent by the orchestrator, or after an outage) still shows the trial's true duration.
        self.started_ms: int = int(state.get("started_ms") or time.time() * 1000)
        self.ended_ms: int | None = state.get("ended_ms")
        self.rows = list(self._read_rows())
        self.last_step = max([self.through_step] + [r["step"] for r in self.rows])

    @property
    def _state_path(self) -> Path:
        return self.root / "run.json"

    @property
    def _rows_path(self) -> Path:
        return self.root / "pending.jsonl"

    @property
    def _tags_path(self) -> Path:
        return self.root / "tags.json"

    def save_state(self) -> None:
        atomic_write_json(self._state_path, {"run_id": self.run_id, "through_step": self.through_step,
                                             "end_status": self.end_status,
                                             "params_logged": self.params_logged,
                                             "creation_token": self.creation_token,
                                             "started_ms": self.started_ms,
                                             "ended_ms": self.ended_ms})

    def set_end(self, status: str) -> None:
        """Record the run's final status (sent after everything else) and when it ended."""
        self.end_status = status
        self.ended_ms = int(time.time() * 1000)
        self.save_state()

    # ----------------------------------------------------------------- metrics

    def _read_rows(self) -> Iterator[dict[str, Any]]:
        if not self._rows_path.exists():
            return
        with open(self._rows_path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    # Only the last line can be torn (a crash mid-append); it was never sent either.
                    continue
                if row["step"] > self.through_step:
                    yield row

    def add_rows(self, rows: Sequence[tuple[int, Mapping[str, float]]]) -> int:
        """Append rows for steps beyond everything buffered or sent; returns how many were new."""
        fresh = []
        now = int(time.time() * 1000)
        for step, values in sorted(rows, key=lambda r: r[0]):
            step = int(step)
            if step <= self.last_step or not values:
                continue
            fresh.append({"step": step, "ts": now, "metrics": {k: float(v) for k, v in values.items()}})
            self.last_step = step
        if not fresh:
            return 0
        with open(self._rows_path, "a") as fh:
            fh.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in fresh)
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.extend(fresh)
        return len(fresh)

    def mark_sent(self, through_step: int) -> None:
        """Everything up to ``through_step`` is in the store: drop it from the outbox."""
        self.through_step = max(self.through_step, through_step)
        self.rows = [r for r in self.rows if r["step"] > self.through_step]
        self.save_state()
        tmp = self._rows_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in self.rows)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._rows_path)

    # ----------------------------------------------------------------- tags and artifacts

    def pending_tags(self) -> dict[str, str]:
        return dict(read_json(self._tags_path)["tags"]) if self._tags_path.exists() else {}

    def add_tags(self, tags: Mapping[str, str]) -> None:
        merged = {**self.pending_tags(), **{str(k): str(v) for k, v in tags.items()}}
        atomic_write_json(self._tags_path, {"tags": merged})

    def drop_tags(self, sent: Mapping[str, str]) -> None:
        left = {k: v for k, v in self.pending_tags().items() if sent.get(k) != v}
        if left:
            atomic_write_json(self._tags_path, {"tags": left})
        else:
            self._tags_path.unlink(missing_ok=True)

    def add_artifact(self, name: str, data: Any) -> Path:
        path = self.root / "artifacts" / name
        atomic_write_json(path, data)
        return path

    def pending_artifacts(self) -> list[Path]:
        return sorted(p for p in (self.root / "artifacts").iterdir() if p.is_file() and not p.name.startswith("."))

    def artifact_sent(self, path: Path) -> None:
        done = self.root / "sent"
        done.mkdir(exist_ok=True)
        shutil.move(str(path), done / path.name)

    def empty(self) -> bool:
        return not self.rows and not self._tags_path.exists() and not self.pending_artifacts()
