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
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from orchestrator.exceptions import UserError
from orchestrator.metrics import mlflow_key
from orchestrator.store.workspace import scoped_environ

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
ROLE_TAG = "ablate.role"  # "grid" (parent) | "trial" (child)
# A trial run's axis labels under their own names (JSON pairs; params hold them under MLflow's
# sanitised keys) and its config id (``TrialSpec.config``): what ``ablate compare`` forms cells by.
AXES_TAG = "ablate.axes"
CONFIG_TAG = "ablate.config"

_ENV_LOCK = threading.Lock()

_ENV_LOCK = threading.Lock()


def sanitize_key(key: str) -> str:
    """verl 0.9.1's MLflow key sanitiser (``orchestrator.metrics.mlflow_key``)."""
    return mlflow_key(key)


def client(tracking_uri: str) -> MlflowClient:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def log_steps(tracking_uri: str, run_id: str, name: str, values: dict[int, float]) -> None:
    """Log ``name`` at each step of ``values`` to an existing run, in one request (steps in any
    order: a trial's outbox takes rows in step order only, so a value made for an earlier step,
    such as a reference score, goes this way). Raises what MLflow raises."""
    from mlflow.entities import Metric  # deferred: mlflow only where values are sent

    now = int(time.time() * 1000)
    client(tracking_uri).log_batch(run_id, metrics=[
        Metric(mlflow_key(name), v, now, s) for s, v in sorted(values.items())])


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@functools.lru_cache(maxsize=16)
def use_wal(tracking_uri: str) -> str | None:
    """Switch an SQLite store to write-ahead logging (persistent); returns its journal mode.

    MLflow commits twice per ``log_batch``: in rollback-journal mode each commit fsyncs journal
    and database, in WAL mode only the log, equally durable (``synchronous`` stays FULL); readers
    (``ablate ui``) no longer block writers. Best effort: a store held open elsewhere stays as is.
    """
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


_DATABASES = ("postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")


PROBE_S = 5.0  # how long a tracking server (or a Ray address) may take to accept a connection


def check_store(uri: str, *, probe_s: float = PROBE_S) -> None:
    """A tracking URI that can work, checked before anything starts (``UserError``, one line):
    a known scheme, a server URL with a host that answers within ``probe_s`` seconds, a
    ``sqlite:`` file that can be created or opened as a database, a database server whose
    driver is installed. MLflow 3 refuses ``file:`` stores, so they are refused here, before
    Ray starts. A server that goes down later is not an error (metrics wait on disk)."""

    def bad(problem: str, fix: str) -> Exception:
        return UserError(f"tracking URI {_shown(uri)!r}: {problem}; fix: {fix}")

    fix = ("pass --tracking-uri (or $MLFLOW_TRACKING_URI) as http(s)://HOST:PORT or "
           "sqlite:///PATH/mlflow.db")
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        if not parsed.hostname:
            raise bad("no host in the server URL", fix)
        try:
            port = parsed.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise bad("the port is not a number", fix) from None
        problem = _unreachable(uri, probe_s)
        if problem is not None:
            raise bad(f"no MLflow server answers at {parsed.hostname}:{port} ({problem})",
                      "start the server (or check the host and port), or pass another "
                      "--tracking-uri, e.g. sqlite:///PATH/mlflow.db")
        return
    if scheme == "sqlite":
        if not uri.startswith("sqlite:///"):
            raise bad("a SQLite URI has three slashes before the path", "sqlite:///PATH/mlflow.db")
        path = uri.removeprefix("sqlite:///").split("?", 1)[0]
        if path in ("", ":memory:"):
            raise bad("no database file", "sqlite:///PATH/mlflow.db")
        _check_sqlite(Path(path), bad)
        return
    if scheme in ("file", "") and (scheme or uri.startswith(("/", "."))):
        where = Path(parsed.path if scheme else uri)
        raise bad("MLflow 3 no longer runs file stores (a directory of runs)",
                  f"use a SQLite store, e.g. sqlite:///{where.parent / 'mlflow.db'} (an existing "
                  f"directory of runs converts with `mlflow migrate-filestore`)")
    if scheme in _DATABASES or scheme.split("+", 1)[0] in _DATABASES:
        _check_driver(uri, bad)
        return  # a database server: the first connection tells
    raise bad(f"unknown scheme {scheme + ':' if scheme else '(none)'}", fix)


def _shown(uri: str) -> str:
    """``uri`` cut to 200 characters, without a password (``scheme://user:***@host``)."""
    parsed = urlparse(uri)
    if parsed.password:
        uri = uri.replace(f":{parsed.password}@", ":***@", 1)
    return uri[:200]


def _unreachable(url: str, timeout_s: float) -> str | None:
    """Why the server at ``url`` gives no HTTP answer within ``timeout_s`` (None: it answers,
    whatever the status). Through the same proxies as MLflow's own requests."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None  # an answer (401, 404, ...): something listens; MLflow says what
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout_s:g} s"
        return getattr(reason, "strerror", None) or str(reason)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def _check_driver(uri: str, bad: Any) -> None:
    """The Python driver SQLAlchemy loads for a database URI is installed (checked without
    connecting): ``postgresql://`` without psycopg2 would fail deep inside MLflow."""
    try:
        from sqlalchemy.engine import make_url

        dialect = make_url(uri).get_dialect()
        dialect.import_dbapi()
    except ModuleNotFoundError as exc:
        name = (exc.name or "?").split(".", 1)[0]
        raise bad(f"its database driver {name!r} is not installed",
                  f"pip install {_DRIVER_PACKAGES.get(name, name)}") from None
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's own "cannot parse"/"no such dialect"
        raise bad(f"not a database URL SQLAlchemy can use ({type(exc).__name__})",
                  "DIALECT[+DRIVER]://USER:PASSWORD@HOST:PORT/DB") from None


_DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "psycopg": "'psycopg[binary]'",
                    "pymysql": "pymysql", "MySQLdb": "mysqlclient", "pyodbc": "pyodbc"}


def store_exists(uri: str) -> bool:
    """Whether a local store has been created (a reader must not create an empty one); a
    server store always counts as there."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).is_file()
    return True


def _writable_place(path: Path) -> tuple[Path, str | None]:
    """The nearest existing ancestor of ``path`` and what stops writing there (or None)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return probe, f"{probe} is not a directory"
    try:  # creating a file is the one test that holds for root, /proc and read-only mounts
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return probe, f"{probe} is not writable ({exc.strerror})"
    return probe, None


def _check_sqlite(path: Path, bad: Any) -> None:
    """The database file opens (and is one), or its directory lets it be created."""
    if path.is_dir():
        raise bad(f"{path} is a directory, not a database file", "name a file: sqlite:///DIR/mlflow.db")
    if not path.exists():
        _probe, problem = _writable_place(path.parent)
        if problem is not None:
            raise bad(f"cannot create {path}: {problem}", "put the database in a writable directory")
        return
    _probe, problem = _writable_place(path.parent)
    if problem is None and not os.access(path, os.W_OK):
        problem = f"{path} is read-only"
    if problem is not None:  # SQLite writes its journal beside the file, even to read
        raise bad(f"cannot write {path}: {problem}", "put the database in a writable directory")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            db.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        raise bad(f"{path} cannot be opened as a SQLite database ({exc})",
                  "point it at an MLflow database, or at a new file") from None
