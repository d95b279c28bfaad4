"""The file between a trial's job and the orchestrator: ``events.jsonl`` in the attempt's job
directory, appended by the job (one JSON object a line, flushed and fsynced) and read by the
orchestrator from where it stopped, whole lines only.

Records: ``start`` (job id, node, Slurm restart count), ``environment`` (facts), ``metrics``
(one step), ``checkpoint`` (a step's checkpoint directory, complete), ``result`` (the attempt's
outcome) or ``error`` (what ended it: ``user``, ``checkpoint`` or ``infra``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EVENTS = "events.jsonl"


class EventWriter:
    def __init__(self, job_dir: Path) -> None:
        self._fh = open(job_dir / EVENTS, "a", encoding="utf-8")  # noqa: SIM115 - job-long

    def write(self, kind: str, /, **data: Any) -> None:
        """Append one record; ``kind`` is its type (positional: an error record has a ``kind``
        field of its own)."""
        self._fh.write(json.dumps({"type": kind, **data}, allow_nan=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


class EventReader:
    """New complete records since the last ``poll``."""

    def __init__(self, job_dir: Path) -> None:
        self.path = job_dir / EVENTS
        self._offset = 0

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]
