"""Variants of the deterministic double (``tests/doubles.py``) for Ray workers.

Ray workers keep the environment their raylet started with, so these read their switches from
files in the grid's directory instead of environment variables:

* ``PacedDouble``: the double with the per-step sleep of ``<grid_dir>/double_step_s`` (if the
  file exists), to keep a grid running long enough for another command to meet it.
* ``MetricsDiskFullTrainer``: the write of step 10's metrics fails once per trial with ENOSPC.
* ``DiskFullTrainer``: the first checkpoint save at step 10 of each trial writes half of its
  state file and then fails with ``OSError(ENOSPC)``, as a full disk does mid-write; a marker
  file ``enospc`` in the trial's directory makes it happen once per trial.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from doubles import DoubleTrainer

DISKFULL_STEP = 10


def _trial_root(ctx: Any) -> Path:
    return Path(ctx.workdir).parent.parent  # <grid>/trials/<id>/work/attempt-N


class PacedDouble(DoubleTrainer):
    def run(self, trial: Any, config: Mapping[str, Any], ctx: Any) -> Any:
        pace = _trial_root(ctx).parent.parent / "double_step_s"
        if pace.exists():
            os.environ["ABLATE_DOUBLE_STEP_S"] = pace.read_text().strip()
        return super().run(trial, config, ctx)


class _DiskFullContext:
    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._marker = _trial_root(ctx) / "enospc"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        if step != DISKFULL_STEP or self._marker.exists():
            self._ctx.save_checkpoint(step, write)
            return

        def full_disk(d: Path) -> None:
            write(d)
            for f in d.rglob("*"):  # the disk filled up half way through the last file
                if f.is_file():
                    data = f.read_bytes()
                    f.write_bytes(data[: len(data) // 2])
            self._marker.write_text(str(step))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(d / "state.json"))

        self._ctx.save_checkpoint(step, full_disk)


class DiskFullTrainer(DoubleTrainer):
    def run(self, trial: Any, config: Mapping[str, Any], ctx: Any) -> Any:
        return super().run(trial, config, _DiskFullContext(ctx))


class _MetricsDiskFullContext:
    """``log_metrics`` of step ``DISKFULL_STEP`` fails once per trial with ENOSPC, as the
    append to ``metrics.jsonl`` does when the disk fills (marker ``enospc-metrics``)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._marker = _trial_root(ctx) / "enospc-metrics"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == DISKFULL_STEP and not self._marker.exists():
            self._marker.write_text(str(step))
            path = _trial_root(self._ctx) / "metrics.jsonl"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self._ctx.log_metrics(step, metrics)


class MetricsDiskFullTrainer(DoubleTrainer):
    def run(self, trial: Any, config: Mapping[str, Any], ctx: Any) -> Any:
        return super().run(trial, config, _MetricsDiskFullContext(ctx))
