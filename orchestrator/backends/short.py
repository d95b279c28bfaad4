"""Work that is not an attempt of a trial (a probe's job), run to its end where a pool's trials
run (``Launcher.run_short``): in this process for the local launcher, as a batch job on the
pool's partition for Slurm.

A short job is a module with ``run(job_dir)`` (raises on failure) and ``main(argv)`` (``python
-m MODULE JOB_DIR``: ``run``, and on failure :func:`write_error` before the exit), its input and
its result files in ``job_dir``: the launcher only runs it and says how it ended.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import InfraFailure, UserError
from orchestrator.store import atomic_write_json, workspace

RESULT = "result.json"  # what a job that ended well leaves
ERROR = "error.json"  # what a job that failed leaves: its kind (user, infra) and one line


@dataclasses.dataclass(frozen=True)
class ShortJob:
    """One short job: ``python -m module job_dir`` on ``config.pool`` with ``environment``."""

    name: str  # unique among the jobs run together, file-safe (a probe id)
    config: TrialConfig  # its pool places it
    environment: Mapping[str, str | None]  # the trainer's, and the job's own (None: unset)
    job_dir: Path  # on a file system the pool's nodes share
    module: str

    @property
    def result(self) -> Path:
        return self.job_dir / RESULT

    def argv(self) -> list[str]:
        """What runs it elsewhere: this Python, the module, its directory."""
        return [sys.executable, "-m", self.module, str(self.job_dir)]

    def run_here(self) -> None:
        """Run it in this process under its environment (the local launcher's way)."""
        with workspace.scoped_environ(dict(self.environment)):
            importlib.import_module(self.module).run(self.job_dir)

    def check_ended(self, how: str) -> None:
        """Raise unless it left its result: the error it wrote (a user error stays one), else
        an infrastructure failure saying ``how`` it ended (the launcher's words)."""
        if self.result.is_file():
            return
        try:
            error = json.loads((self.job_dir / ERROR).read_text())
            kind, message = str(error["kind"]), str(error["message"])
        except (OSError, ValueError, KeyError, TypeError):
            raise InfraFailure(f"short job {self.name} ended without a result ({how}); its log "
                               f"is in {self.job_dir}") from None
        raise (UserError if kind == "user" else InfraFailure)(message)


def write_error(job_dir: Path, exc: BaseException) -> None:
    """What ``main`` leaves when ``run`` raised: the orchestrator raises it again, a user error
    as a user error (one line), anything else as an infrastructure failure."""
    kind = "user" if isinstance(exc, UserError) else "infra"
    message = str(exc) if kind == "user" else f"{type(exc).__name__}: {exc}"
    atomic_write_json(job_dir / ERROR, {"kind": kind, "message": message})


def clear(job_dir: Path) -> None:
    """Remove an earlier try's result and error before the job runs again."""
    for name in (RESULT, ERROR):
        (job_dir / name).unlink(missing_ok=True)


def limit_of(limits: Mapping[str, int], config: TrialConfig) -> int:
    """How many short jobs of ``config``'s pool may run at once: the caller's limit for the
    pool, else the pool's capacity."""
    return min(limits.get(config.pool.name, config.pool.capacity), config.pool.capacity)
