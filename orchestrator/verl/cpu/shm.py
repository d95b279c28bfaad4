"""The shared-memory segments a verl job leaves in ``/dev/shm`` when it dies mid weight sync.

Without CUDA IPC, verl 0.9.1 hands weights to the vLLM server through a POSIX shared-memory
segment per sync, named ``verl_weights_<uuid hex>`` (``verl/workers/rollout/vllm_rollout/
bucketed_weight_transfer.py:190-191``), which the sender unlinks when the sync ends (:214-216).
A job killed or failed during a sync leaves it behind, the size of a bucket (issue 37: 2 GiB).
Python's ``multiprocessing.shared_memory`` names its own segments ``psm_<hex>`` (vLLM's
message queues). The launcher snapshots ``/dev/shm`` before the job and, after the job's
processes are gone, removes the new segments with those prefixes that no live process maps
(another job's segments on the same machine are in use, or predate this one).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM = Path("/dev/shm")
PREFIXES = ("verl_weights_", "psm_")


def snapshot(root: Path = SHM) -> frozenset[str]:
    """Names of the segments now in ``root`` with one of :data:`PREFIXES`."""
    try:
        return frozenset(e.name for e in os.scandir(root) if e.name.startswith(PREFIXES))
    except OSError:
        return frozenset()


def _mapped(root: Path) -> set[str]:
    """Segment names under ``root`` that some live process maps (``/proc/<pid>/maps``)."""
    out: set[str] = set()
    prefix = str(root).rstrip("/") + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError), \
                open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                i = line.find(prefix)
                if i >= 0:
                    out.add(line[i + len(prefix):].split(" ")[0].strip())
    return out


def remove_new(before: frozenset[str], root: Path = SHM) -> list[str]:
    """Unlink the segments that appeared since ``before`` and no live process maps; returns
    their names."""
    new = snapshot(root) - before
    if not new:
        return []
    busy = _mapped(root)
    removed = []
    for name in sorted(new - busy):
        with contextlib.suppress(FileNotFoundError):
            (root / name).unlink()
            removed.append(name)
    return removed
