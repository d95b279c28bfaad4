"""A full disk during a submission: a clean stop with one line that says how much space the grid
still needs, instead of tracebacks from every process that tried to write.

Where the disk fills decides who sees it first: a trial's runner (a metrics line, a checkpoint,
``state.json``: ``_trainable`` reports it as a ``fault`` instead of letting Tune retry onto the
same full disk, and the attempt is recorded as an infra failure when the disk still takes that
write, else by the next submission), the orchestrator's own writes (the grid's records, the
live table's ``queue.json``), or the SQLite tracking store. All end in ``DiskFullError``: trials
that did not finish stay resumable from their last verified checkpoint, so freeing space and
submitting again continues the grid.
"""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.exceptions import DiskFullError
from orchestrator.schema import CheckpointSpec
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.trial import TrialSpec, TrialState

_MESSAGES = ("no space left on device", "database or disk is full", "disk quota exceeded")


def is_disk_full(exc: BaseException) -> bool:
    """An ``OSError`` ENOSPC/EDQUOT, or an error caused by one (SQLite says it in words)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in workspace.DISK_FULL:
            return True
        if any(m in str(cur).lower() for m in _MESSAGES):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def fault_error(results: Mapping[str, Mapping[str, Any]]) -> OSError | None:
    """The first full disk a trial reported (``_trainable``), as the error that stops the
    submission, or None."""
    fault = next((str(r["fault"]) for r in results.values() if r.get("fault")), None)
    return None if fault is None else OSError(errno.ENOSPC, fault)


def tree_size(root: Path) -> int:
    """Bytes the files under ``root`` take on disk."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            total += _file_size(Path(dirpath, f))
    return total


def space_needed(grid_dir: Path, trials: Iterable[TrialSpec], checkpoint: CheckpointSpec) -> int | None:
    """About how many more bytes the unfinished trials' files take until they finish: a
    finished trial's size (else the largest projection of an unfinished one) for each, less
    what each already has. None when no trial has written a step to measure from.

    A projection scales what grows with the steps (metrics, logs) to the trial's steps, and
    counts its checkpoints as many as retention holds at its end: ``checkpoint.keep`` plus the
    protected healthy one, at most one per ``checkpoint.every`` steps. Scaling the checkpoints
    with the steps too would count every checkpoint ever saved (twice the truth and more on
    a 40-step trial stopped at step 5, CI's disk-full test)."""
    sizes: dict[str, tuple[int, TrialSpec, records.TrialRecord, TrialPaths]] = {}
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        try:
            rec = records.load_state(paths, t.trial_id)
        except ValueError:
            continue
        sizes[t.trial_id] = (tree_size(paths.root) if paths.root.exists() else 0, t, rec, paths)
    done = [size for size, _t, rec, _p in sizes.values() if rec.state is TrialState.DONE]
    projected = [_projected(size, t.steps, rec.last_step, paths, checkpoint)
                 for size, t, rec, paths in sizes.values() if rec.last_step > 0]
    per_trial = max(done or projected or [0])
    if per_trial <= 0:
        return None
    return int(sum(max(per_trial - size, 0) for size, _t, rec, _p in sizes.values()
                   if not rec.state.is_finished()))


def _projected(size: int, steps: int, last_step: int, paths: TrialPaths,
               checkpoint: CheckpointSpec) -> float:
    """The bytes a trial ``size`` bytes big at ``last_step`` takes at ``steps`` (see
    ``space_needed``): its metrics and logs scaled to the steps, its checkpoints as many as
    retention holds at the end, the rest (records, the tracking outbox) as they are. Without a
    checkpoint to measure one by (none saved yet, or a remote store), all of it is scaled."""
    saved = [d for d in paths.checkpoints.glob("step-*") if d.is_dir()]
    if not saved:
        return size * steps / last_step
    held = sum(tree_size(d) for d in saved)
    growing = sum(tree_size(p) if p.is_dir() else _file_size(p)
                  for p in (paths.metrics, paths.log, paths.root / "logs"))
    at_end = min(steps // checkpoint.every, checkpoint.keep + 1)
    return (size - held - growing + growing * steps / last_step
            + held / len(saved) * max(at_end, len(saved)))


def _file_size(path: Path) -> int:
    """Bytes one file takes on disk (its blocks, or its size if larger); 0 if it is gone."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    return max(st.st_size, st.st_blocks * 512)


def disk_full(where: Path, grid_dir: Path, trials: Iterable[TrialSpec], detail: str,
              checkpoint: CheckpointSpec) -> DiskFullError:
    """The one-line error: where, what is free, about how much more the grid needs, the fix."""
    free = workspace.free_bytes(where)
    need = space_needed(grid_dir, trials, checkpoint)
    have = f"{workspace.human(free)} free there" if free is not None else "free space unknown"
    more = (f"its unfinished trials need about {workspace.human(need)} more (measured from its "
            f"own trials' files)" if need else "no trial has written a step yet to measure how "
            "much a trial needs")
    return DiskFullError(f"disk full under {where} ({detail[:200]}); {have}; {more}; the "
                         f"submission stopped, unfinished trials keep their last checkpoint; "
                         f"fix: free space (or pass --workdir on a larger disk) and `ablate "
                         f"submit` the grid again: every trial resumes where it stopped")



@contextlib.contextmanager
def stop_on_full_disk(grid_dir: Path, trials: Iterable[TrialSpec],
                      checkpoint: CheckpointSpec) -> Iterator[None]:
    """Turn a full disk met anywhere inside (a write of this process, a trial's ``fault``
    raised by the fit) into the one-line ``DiskFullError``."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise disk_full(grid_dir.parent, grid_dir, list(trials), detail, checkpoint) from None
