"""Where a grid's durable state lives on disk, the default MLflow store, and the process
environment they are read from (``scoped_environ``).

Layout (``--workdir``, default ``./.ablate``, or ``$ABLATE_WORKDIR``)::

    .ablate/
      mlflow.db                 embedded MLflow tracking store (SQLite)
      mlartifacts/              its artifact store
      <grid>/
        grid.json               the validated grid (file path, digest) of the last submission
        identity.json           what the grid's name stands for: its trial-defining fields and trial ids
        recipe.json             the composed recipe the trials were built from
        lease.json              which orchestrator process owns the grid right now
        tune/                   Ray Tune experiment directory (for restore)
        trials/<trial_id>/      spec.json state.json attempts.json metrics.jsonl checkpoints/
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from orchestrator.exceptions import UserError

DEFAULT_WORKDIR = ".ablate"


def workdir(path: str | os.PathLike[str] | None = None) -> Path:
    """The working directory (absolute; created on first use by the writers, not here)."""
    chosen = path or os.environ.get("ABLATE_WORKDIR") or DEFAULT_WORKDIR
    return Path(chosen).expanduser().resolve()


def grid_dir(grid_name: str, root: str | os.PathLike[str] | None = None) -> Path:
    return workdir(root) / grid_name


def tracking_uri(uri: str | None = None, root: str | os.PathLike[str] | None = None) -> str:
    """``uri``, else $MLFLOW_TRACKING_URI, else the embedded SQLite store under the workdir."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{workdir(root) / 'mlflow.db'}"


def artifact_root(root: str | os.PathLike[str] | None = None) -> Path:
    return workdir(root) / "mlartifacts"


def canonical_uri(uri: str) -> str:
    """``uri`` as a record or a message names it: a SQLite file by its absolute path (a relative
    one is read from the current folder, which another command may not share), no credentials.
    Generated files use ``display_uri`` instead (no path of this machine)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        return f"sqlite:///{(Path.cwd() / path).resolve().as_posix()}"
    return _without_credentials(uri)


def _without_credentials(uri: str) -> str:
    if "://" in uri and "@" in uri.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = uri.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return uri


def display_uri(uri: str, root: str | os.PathLike[str] | None = None) -> str:
    """``uri`` as generated files name it: no absolute path of this machine, no credentials.

    A SQLite store inside the current directory is named relative to it (``sqlite:///.ablate/
    mlflow.db``, as the README's commands leave it); one elsewhere in the workdir as
    ``sqlite:///<workdir>/mlflow.db``; any other file by its name only."""
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_absolute():
            return uri
        for base, label in ((Path.cwd().resolve(), ""), (workdir(root), "<workdir>/")):
            try:
                return f"sqlite:///{label}{path.resolve().relative_to(base).as_posix()}"
            except ValueError:
                continue
        return f"sqlite:///<...>/{path.name}"
    return _without_credentials(uri)


def check_workdir(path: str | os.PathLike[str] | None = None, *, write: bool = True) -> Path:
    """The workdir, checked once before a command does anything: a directory (or one that can
    be created), writable when the command writes. A one-line ``UserError`` otherwise."""
    root = workdir(path)
    _check_path_length(root, "workdir", "pass --workdir DIR (or set $ABLATE_WORKDIR) to a shorter path")
    probe = root
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent  # the nearest existing ancestor: where the workdir would be made
    if not probe.is_dir():
        what = "does not exist" if probe.is_symlink() else "is not a directory"
        where = "the workdir" if probe == root else f"{probe} (on the way to the workdir)"
        raise UserError(f"workdir {root}: {where} {what}; fix: pass --workdir DIR (or set "
                        f"$ABLATE_WORKDIR) to a directory, or move {probe} away")
    if write:
        try:  # creating a file is the one test that holds for root and read-only mounts alike
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as exc:
            raise UserError(f"workdir {root}: {probe} is not writable ({exc.strerror}); fix: "
                            f"pass --workdir DIR (or set $ABLATE_WORKDIR) to a writable "
                            f"directory") from None
    return root


def _check_path_length(path: Path, what: str, fix: str) -> None:
    """A path the OS would refuse for its length (ENAMETOOLONG), refused first in one line."""
    limit = 255  # NAME_MAX of every common Linux and macOS file system
    long = next((p for p in path.parts if len(os.fsencode(p)) > limit), None)
    if long is not None or len(os.fsencode(str(path))) >= 4096:
        shown = f"{str(path)[:80]}...[{len(str(path))} chars]"
        part = f"the name {long[:40]}... has {len(os.fsencode(long))} bytes, over {limit}" \
            if long is not None else "the path is over 4095 bytes"
        raise UserError(f"{what} {shown}: {part}; fix: {fix}")


def check_out_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """An output directory named by ``flag`` (``--out``), checked before anything runs: not
    empty, not a file or under one, creatable and writable. A one-line ``UserError``."""
    if not str(path).strip():
        raise UserError(f"{flag} '': an empty path; fix: give {flag} a directory, or leave it out "
                        "for the default")
    out = Path(path).expanduser().absolute()
    _check_path_length(out, flag, f"give {flag} a shorter path")
    fix = f"fix: give {flag} a directory in a writable place"
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {path}: {out} is a file, not a directory; {fix}")
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{flag} {path}: {probe} (on the way to it) is not a directory; {fix}")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path}: {probe} is not writable ({exc.strerror}); {fix}") from None
    return out


def dry_run_dir(out_dir: str | None, *, default: str, files: str, pattern: str) -> tuple[Path, Path]:
    """The directory ``ablate submit --dry-run`` writes (k8s manifests, Slurm job scripts):
    ``out_dir`` (``--out``, checked) or ``default``, and its ``files`` subdirectory, emptied of
    the files an earlier dry run wrote there (``pattern``; nothing else is touched)."""
    out = check_out_dir(out_dir, "--out") if out_dir is not None else Path(default)
    sub = out / files
    sub.mkdir(parents=True, exist_ok=True)
    for stale in sub.glob(pattern):
        stale.unlink()
    return out, sub


def write_dry_run_index(out: Path, grid: str, trials: list[dict], **extra: object) -> None:
    """``<out>/index.json``: the grid, what the backend adds, one entry per trial."""
    (out / "index.json").write_text(json.dumps({"grid": grid, **extra, "trials": trials},
                                               indent=1), encoding="utf-8")


# What a full disk is (the device, or the user's quota).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or its nearest existing ancestor)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def human(n: float) -> str:
    """Bytes for people: ``12.3 MB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


@contextlib.contextmanager
def scoped_environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (None: unset) environment variables for the duration of a block, then restore them.
    Libraries that read settings only from the environment (Tune, MLflow's HTTP client, a Ray
    node starting its workers) need it."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
