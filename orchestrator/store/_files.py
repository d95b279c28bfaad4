"""Atomic file I/O of durable state: where a trial's files are and how JSON reaches disk.

Every JSON state file (``state.json``, ``attempts.json``, the lease, checkpoint manifests, the
MLflow outbox) is written through :func:`atomic_write_json` (temp file + fsync + rename, with a
schema version) and read through :func:`read_json`, which turns a truncated or garbage file into
a one-line ``StateFileError`` naming the file and the fix.
"""
from __future__ import annotations

import functools
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from orchestrator.exceptions import StateFileError

SCHEMA_VERSION = 1


class TrialPaths:
    """Names every file of one trial's directory (``<workdir>/<grid>/trials/<trial_id>/``); each
    name is made once per instance (``ablate status`` asks for four of them per trial)."""

    def __init__(self, grid_dir: Path, trial_id: str) -> None:
        self.root = Path(grid_dir, "trials", trial_id)

    @functools.cached_property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @functools.cached_property
    def state(self) -> Path:
        return self.root / "state.json"

    @functools.cached_property
    def attempts(self) -> Path:
        return self.root / "attempts.json"

    @functools.cached_property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @functools.cached_property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @functools.cached_property
    def result(self) -> Path:
        return self.root / "result.json"

    @functools.cached_property
    def summary(self) -> Path:
        """Written once at the trial's end (``store.summary``)."""
        return self.root / "summary.json"

    @functools.cached_property
    def reference(self) -> Path:
        """Reference scores of its checkpoints, made after the fact (``store.reference``)."""
        return self.root / "reference.json"

    @functools.cached_property
    def outbox(self) -> Path:
        """The trial's MLflow outbox: what its run is still owed (``tracking._outbox``)."""
        return self.root / "mlflow-buffer"

    @functools.cached_property
    def log(self) -> Path:
        return self.root / "trial.log"

    @functools.cached_property
    def warning(self) -> Path:
        """The first warning the trial's runner saw, written as it fired (``run._attempt``), so
        the grid's ``warning`` alert goes out while the trial still runs."""
        return self.root / "warning.json"

    @functools.cached_property
    def run_lock(self) -> Path:
        """Held (``flock``) by whoever writes the trial's files: its runner for a whole attempt,
        the orchestrator while it sends the trial's MLflow outbox or resets a dead run."""
        return self.root / ".run.lock"


def _umask() -> int:
    """The process's umask now, read without changing it (Linux: /proc; elsewhere set and
    reset). Not cached: a process may change its umask between writes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, write: Callable[[TextIO], None]) -> None:
    """Write a file via temp file + fsync + rename, so readers never see it half-written. It
    gets the mode a plain write gives (the file's own if it exists, else 0666 less the umask),
    not the temp file's 0600: a lab's records and results on a shared file system stay
    readable by its members."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
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


# What removing each file costs: the runner rebuilds a missing state.json as a pending trial
# that resumes from its last verified checkpoint (its MLflow run is found again through the
# trial's outbox, so no step is sent twice).
_FIXES = {
    "state.json": "delete it and submit the grid again; the trial resumes from its last verified "
                  "checkpoint and keeps its MLflow run",
    "attempts.json": "delete it and submit the grid again; metrics and checkpoints are kept, the "
                     "trial's list of attempts comes back from its MLflow run if the run has it "
                     "(else it is lost)",
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
        with open(path, "rb") as fh:  # no text layer: one decode of the whole file
            return json.loads(fh.read().decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise corrupt_state_file(path, f"{exc.msg}: line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise corrupt_state_file(path, "not UTF-8 text") from None
