"""A grid's cancel requests (``cancel.json``): the trials ``ablate cancel`` asked to stop, read by
their runners and cleared once carried out. Part of ``records``' interface (re-exported there).
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.store._files import atomic_write_json, read_json


def cancel_path(grid_dir: Path) -> Path:
    return Path(grid_dir) / "cancel.json"


def _cancel_lock(grid_dir: Path) -> Any:
    from filelock import FileLock

    return FileLock(str(Path(grid_dir) / ".cancel.lock"), timeout=30)


def cancel_requests(grid_dir: Path) -> dict[str, float]:
    path = cancel_path(grid_dir)
    if not path.exists():
        return {}
    try:
        return dict(read_json(path).get("trials", {}))
    except ValueError:
        return {}


def add_cancel_requests(grid_dir: Path, trial_ids: Iterable[str]) -> None:
    with _cancel_lock(grid_dir):
        current = cancel_requests(grid_dir)
        now = time.time()
        current.update({t: now for t in trial_ids if t not in current})
        atomic_write_json(cancel_path(grid_dir), {"trials": current})


def clear_cancel_requests(grid_dir: Path, trial_ids: Iterable[str]) -> None:
    """Drop requests that were carried out (so a later ``ablate resume`` is not cancelled again)."""
    ids = set(trial_ids)
    if not ids or not cancel_path(grid_dir).exists():
        return
    with _cancel_lock(grid_dir):
        current = cancel_requests(grid_dir)
        if ids & set(current):
            atomic_write_json(cancel_path(grid_dir),
                              {"trials": {k: v for k, v in current.items() if k not in ids}})
