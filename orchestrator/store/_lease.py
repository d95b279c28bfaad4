"""The grid lease: at most one orchestrator process drives a grid at a time.

An exclusive ``flock`` on ``<grid>/.lease.lock`` is the lease; the kernel drops it when the
holder dies, even by SIGKILL, so a crashed orchestrator never leaves a stale lease behind.
``lease.json`` says who holds it (pid, host, submission) for the message a second ``ablate
submit`` prints and for ``ablate status``. (Per-trial locks, ``.run.lock`` in each trial
directory, are taken by the runner: the two together mean no trial ever runs twice at once.)
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from orchestrator.exceptions import ConcurrencyError
from orchestrator.store._files import atomic_write_json, read_json


def _describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started_at", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {since} (submission {info.get('submission')})"


class GridLease:
    """Exclusive right to run one grid: acquire(), then release() in a finally."""

    def __init__(self, grid_dir: Path, grid_name: str) -> None:
        self.grid_dir = Path(grid_dir)
        self.grid_name = grid_name
        self.info_path = self.grid_dir / "lease.json"
        self._lock: Any = None

    def acquire(self, submission: str) -> None:
        """Take the lease or raise ``ConcurrencyError`` naming its holder; starts nothing."""
        from filelock import FileLock, Timeout

        self.grid_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.grid_dir / ".lease.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise ConcurrencyError(
                f"grid {self.grid_name} is already being run by {_describe(self._holder())}; "
                f"watch it with `ablate status {self.grid_name}` or stop it with "
                f"`ablate cancel {self.grid_name}`") from None
        self._lock = lock
        atomic_write_json(self.info_path, {"pid": os.getpid(), "host": socket.gethostname(),
                                           "submission": submission, "started_at": time.time(),
                                           "active": True})

    def _holder(self, wait: float = 2.0) -> dict[str, Any] | None:
        """The live holder's record. A holder that has just taken the lock may not have written
        it yet (the file then still names the previous, finished holder): wait briefly for it."""
        deadline = time.monotonic() + wait
        while True:
            info = active_holder(self.grid_dir)
            if info is not None or time.monotonic() >= deadline:
                return info
            time.sleep(0.05)

    def release(self) -> None:
        if self._lock is None:
            return
        info = holder_info(self.grid_dir) or {}
        try:
            atomic_write_json(self.info_path, {**info, "active": False, "ended_at": time.time()})
        except OSError:  # a full disk: no holder info at all says "free" too
            self.info_path.unlink(missing_ok=True)
        finally:
            self._lock.release()
            self._lock = None


def holder_info(grid_dir: Path) -> dict[str, Any] | None:
    path = Path(grid_dir) / "lease.json"
    try:
        return dict(read_json(path))
    except (FileNotFoundError, ValueError):
        return None


def active_holder(grid_dir: Path) -> dict[str, Any] | None:
    """Who runs the grid now, or None. A holder on this host is checked for being alive
    (a SIGKILLed orchestrator leaves ``active: true`` behind but its pid is gone)."""
    info = holder_info(grid_dir)
    if not info or not info.get("active"):
        return None
    if info.get("host") == socket.gethostname():
        try:
            if process_gone(int(info["pid"]), float(info.get("started_at", 0))):
                return None
        except (ValueError, KeyError, TypeError):
            return None
    return info


def process_gone(pid: int, started_at: float) -> bool:
    """Whether the process ``pid`` that was running at ``started_at`` (epoch seconds) on this
    host has exited. A pid reused by a younger process is not it; a process we may not inspect
    counts as alive."""
    import psutil

    try:
        return psutil.Process(pid).create_time() > started_at + 1
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
