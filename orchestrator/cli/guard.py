"""What the ``ablate`` command line does when its surroundings fail rather than the program:
a reader that closed the pipe, an optional package that is not installed, a path the operating
system refuses. Each is one line and an exit code, never a traceback (``cli.main``).

Closed pipes: ``ablate plan ... | head -3`` and ``ablate submit GRID | head -1``. The reader
leaving is not a reason to stop: a submission keeps running its grid to the end (the trials'
records, not the terminal, are the result; ``ablate status`` shows them), so the guard turns
stdout and stderr into sinks that drop what nobody reads. The alternative, stopping at the next
print, would interrupt trials mid-step for a ``| head`` (resumable, but surprising and costly).
"""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

# Optional packages (import name -> what installs it): the extras of pyproject.toml and the
# database drivers MLflow's SQL stores load.
_EXTRAS = {
    "kubernetes": "k8s", "kubernetes_validate": "k8s", "jsonschema": "k8s",
    "verl": "verl", "transformers": "verl", "tokenizers": "verl", "transfer_queue": "verl",
    "TransferQueue": "verl", "cachetools": "verl", "uvicorn": "verl", "fastapi": "verl",
    "tensordict": "verl", "sglang": "gpu",
}
_DRIVERS = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "pymysql": "pymysql",
            "MySQLdb": "mysqlclient", "pyodbc": "pyodbc"}
# What the OS says about a path it will not use (too long, a loop of links).
PATH_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP)


class _PipeGuard:
    """A text stream that stops writing, silently, once its reader has gone (EPIPE)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def _gone(self) -> None:
        self.closed_by_reader = True
        try:  # the interpreter flushes the real stream at exit: point it at /dev/null
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... of the real stream
        return getattr(self._stream, name)


@contextmanager
def guarded_streams() -> Iterator[None]:
    """stdout and stderr that survive their reader leaving, for the duration of a command."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PipeGuard(sys.stdout), _PipeGuard(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def missing_package(exc: BaseException) -> str | None:
    """One line for an optional package that is not installed (a ``ModuleNotFoundError`` or
    ``importlib.metadata.PackageNotFoundError`` of a name we know), else None."""
    import importlib.metadata

    if isinstance(exc, ModuleNotFoundError):
        name = (exc.name or "").split(".", 1)[0]
    elif isinstance(exc, importlib.metadata.PackageNotFoundError):
        name = str(exc.args[0] if exc.args else exc.name).replace("-", "_")
    else:
        return None
    if name in _EXTRAS:
        extra = _EXTRAS[name]
        where = " on a GPU node" if extra == "gpu" else ""
        return (f"this needs the optional package {name!r}, which is not installed; fix: "
                f"pip install -e '.[{extra}]'{where} (from the rl-ablate checkout; pinned: "
                f"pip install -c tests/constraints.txt -e '.[{extra}]')")
    if name in _DRIVERS:
        return (f"the tracking store's database driver {name!r} is not installed; fix: "
                f"pip install {_DRIVERS[name]}")
    return None


def refused_path(exc: OSError) -> str | None:
    """One line for a path the OS will not use (too long, a loop of links), else None."""
    if exc.errno not in PATH_ERRNOS:
        return None
    name = str(exc.filename or "")
    shown = name if len(name) <= 120 else f"{name[:100]}...[{len(name)} chars]"
    return (f"{shown}: {exc.strerror}; fix: use a shorter path (each name at most 255 bytes) "
            "without a loop of symbolic links, e.g. a shorter --workdir, --out or grid path")
