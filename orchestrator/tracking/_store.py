"""Talking to the MLflow tracking store: the client, HTTP calls that fail fast instead of
retrying for minutes, write-ahead logging for a local SQLite store, which errors are permanent,
and the key and tag names every reader and writer of the runs shares.

Metric names are verl's (``orchestrator.metrics``), sanitised exactly as verl's MLflow logger
does (``sanitize_key``), so a verl job given ``MLFLOW_RUN_ID`` of the child run writes into the
same series.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.environment import scoped_environ

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
ROLE_TAG = "ablate.role"  # "grid" (parent) | "trial" (child)

_INVALID = re.compile(r"[^/\w.\- :]")
_SLASHES = re.compile(r"/+")
_ENV_LOCK = threading.Lock()

_ENV_LOCK = threading.Lock()


def sanitize_key(key: str) -> str:
    """verl 0.9.1's MLflow key sanitiser (``@`` -> ``_at_``, ``//`` -> ``/``, others -> ``_``)."""
    return _INVALID.sub("_", _SLASHES.sub("/", key.replace("@", "_at_")))


def client(tracking_uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@functools.lru_cache(maxsize=16)
def use_wal(tracking_uri: str) -> str | None:
    """Switch an SQLite store to write-ahead logging (persistent); returns its journal mode.

    MLflow commits twice per ``log_batch``: in rollback-journal mode each commit fsyncs journal
    and database, in WAL mode only the log, equally durable (``synchronous`` stays FULL); readers
    (``ablate ui``) no longer block writers. Best effort: a store held open elsewhere stays as is.
    """
    import sqlite3

    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not path or path == ":memory:" or not Path(path).is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=2)) as db:
            mode = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode != "wal":
                mode = str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            return mode
    except sqlite3.Error as exc:
        log.info("kept the journal mode of %s: %s", path, exc)
        return None


@contextlib.contextmanager
def fail_fast(uri: str, timeout_s: int = 10) -> Iterator[None]:
    """Make MLflow's HTTP client give up at once instead of retrying for minutes.

    MLflow reads its retry settings from the environment on each request; the lock keeps two
    threads of this process from restoring each other's values mid-call.
    """
    if not is_remote(uri):
        yield
        return
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    with _ENV_LOCK, scoped_environ(keys):
        yield


def is_permanent(exc: Exception) -> bool:
    """An error that retrying cannot fix (bad request), as opposed to an outage."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        return exc.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST")
    return False
