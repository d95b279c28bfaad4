"""The grid's trial runs as compare reads them, and the list kept while the store is unchanged.

Listing a grid's runs is the one read ``ablate compare`` cannot make cheaper through MLflow: at
1,000 trials ``search_runs`` takes about 7 s on the workdir's SQLite store, and importing MLflow
and opening the store 3-4 s more (``docs/scale.md``). A lab compares the same finished grid
again and again; between two compares nothing is written to the store, and the list is the same.

So for a store that is a local SQLite file, the list is kept in compare's cache directory
(``_cache.cache_dir``) with the store's stamp taken *before* it was read: the size, modification
time and inode of the database and of its ``-wal`` file when that holds writes, and the headers
SQLite rewrites on committed writes (the database header, documented in SQLite's file format;
the WAL's header and the WAL index header at the start of ``-shm``). A later compare whose stamp
is the same reads the list from the cache and never imports MLflow; any write after the stamp
(a trial's metric, a tag set in the UI, another compare's publishing) changes it, and the runs
are read again. A stamp taken before the read can only make the kept list newer than its
stamp, never older, so a hit is what reading would return. (The one write it cannot see leaves
the database's size, modification time and header as they were and its WAL empty again: a
commit, its checkpoint into the database and the WAL's removal, all inside the same tick of
the file system's clock as the checkpoint before it, with the stamp taken in between; an MLflow
write takes longer than that tick.) A server store (``http://``) or any other has no stamp: its
runs are read every time.

The entry also says whether the grid's newest parent run already holds the results this list
produced (``published``, ``_parent``), so a compare with nothing new writes nothing there.
An entry that does not read back whole is ignored with one warning, like the figures' entries.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.compare._cache import cache_dir
from orchestrator.tracking import client

log = logging.getLogger(__name__)

VERSION = 1  # of the entry's layout
_WAL_HEADER = 32  # bytes; a WAL no longer than its header holds no committed write
_SHM_HEADER = 48  # the WAL index header (of its two copies, the first), rewritten by every commit


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What compare reads of one MLflow run: its id, status, tags, params, latest metrics."""

    run_id: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]

    @classmethod
    def of(cls, run: Any) -> RunRecord:
        return cls(run.info.run_id, run.info.status, dict(run.data.tags), dict(run.data.params),
                   {k: float(v) for k, v in run.data.metrics.items()})

    def to_json(self) -> dict[str, Any]:
        # Non-finite metrics as strings: JSON has no NaN, and a NaN must read back a NaN.
        return {"run_id": self.run_id, "status": self.status, "tags": self.tags,
                "params": self.params, "metrics": {k: repr(v) for k, v in self.metrics.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        return cls(str(data["run_id"]), str(data["status"]),
                   {str(k): str(v) for k, v in data["tags"].items()},
                   {str(k): str(v) for k, v in data["params"].items()},
                   {str(k): float(v) for k, v in data["metrics"].items()})


def search_trial_runs(mlc: Any, experiment_id: str) -> list[RunRecord]:
    """Every run of the experiment that carries a ``trial_id`` tag (paged), newest first."""
    runs: list[RunRecord] = []
    token = None
    while True:
        page = mlc.search_runs([experiment_id], filter_string="tags.trial_id != ''",
                               max_results=1000, order_by=["attributes.start_time DESC"],
                               page_token=token)
        runs.extend(RunRecord.of(r) for r in page)
        token = page.token
        if not token:
            return runs


def store_stamp(uri: str) -> str | None:
    """The stamp of a local SQLite store (see the module docstring); None for any other store
    or one that cannot be read. A WAL without frames (absent, or left empty by a read-only
    reader such as ``check_store``) counts as absent, and then its index too: only files that
    hold committed data are in the stamp, so a read never changes it."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
    try:
        st = db.stat()
        parts = [str(db.resolve()).encode(), f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode(),
                 _head(db, 100)]
        with contextlib.suppress(FileNotFoundError):
            ws = wal.stat()
            if ws.st_size > _WAL_HEADER:
                parts += [f"{ws.st_size}:{ws.st_mtime_ns}:{ws.st_ino}".encode(), _head(wal, _WAL_HEADER),
                          _head(shm, _SHM_HEADER) if shm.exists() else b"no index"]
    except OSError:
        return None
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


@dataclasses.dataclass
class Listing:
    """A grid's runs (``runs``), its experiment, and what the entry knows of its parent run."""

    experiment_id: str
    runs: list[RunRecord]
    published: str = ""  # the results digest the newest parent run holds ("": unknown)
    cached: bool = False  # read from the cache, not from the store


def _entry(uri: str, grid: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    # A file beside the pieces' entries (directories, which ``_cache`` prunes), one per store and grid.
    name = hashlib.sha256(f"{uri}\0{grid}".encode()).hexdigest()[:32]
    return root / f"runs-{name}.json"


def cached(uri: str, grid: str, stamp: str | None) -> Listing | None:
    """The runs kept for ``stamp``, or None (no stamp, no entry, another stamp, damaged)."""
    path = _entry(uri, grid)
    if stamp is None or path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("version") != VERSION or data.get("stamp") != stamp:
            return None
        return Listing(str(data["experiment_id"]), [RunRecord.from_json(r) for r in data["runs"]],
                       str(data.get("published", "")), cached=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("compare's kept run list %s is damaged (%s): ignored, the runs are read "
                    "from the store", path.name, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def keep(uri: str, grid: str, stamp: str | None, listing: Listing) -> None:
    """Keep ``listing`` for ``stamp`` (atomically; never fails compare)."""
    path = _entry(uri, grid)
    if stamp is None or path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": VERSION, "stamp": stamp, "experiment_id": listing.experiment_id,
                           "published": listing.published, "runs": [r.to_json() for r in listing.runs]})
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as exc:
        log.warning("could not keep compare's run list: %s", exc)


def listing(uri: str, grid: str, stamp: str | None, mlc: Any,
            experiment_id: Callable[[Any], str]) -> Listing:
    """The grid's runs: kept ones while the store's stamp is ``stamp``, else read through the
    client ``mlc`` (a ``LazyClient``: made only now) from the experiment ``experiment_id(mlc)``
    names."""
    hit = cached(uri, grid, stamp)
    if hit is not None:
        return hit
    exp = experiment_id(mlc)
    return Listing(exp, search_trial_runs(mlc, exp))


def results_digest(out: Path) -> str:
    """A digest of what ``_parent`` logs of ``out``: every file under it, by name and bytes."""
    h = hashlib.sha256()
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        h.update(path.relative_to(out).as_posix().encode() + b"\0"
                 + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


class LazyClient:
    """An MLflow client of ``uri`` made on first use: a compare whose runs were kept and whose
    results the parent run holds never imports MLflow (2-4 s of a compare's start)."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = client(self._uri)  # MLflow's import is inside
        return getattr(self._client, name)
