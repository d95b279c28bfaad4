"""Compare's costliest pieces, reused while their inputs are unchanged (issue 58).

A profile of ``ablate compare`` (docs/scale.md) puts most of its seconds in drawing the
plots (matplotlib rendering and PNG encoding) and in the fANOVA forests, not in reading the
trials. A lab runs compare again and again on the same grid; while the trials it compares are
the same, so are those outputs. Each piece is keyed by a SHA-256 of everything it reads (the
``TrialResult`` values in full, its arguments, the source of ``orchestrator/compare`` and
``orchestrator/stats`` and the versions of the libraries that draw and fit) and kept under the
user's cache directory (``$ABLATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ablate/compare``, else
``~/.cache/ablate/compare``), one directory per key: the figures' bytes and the piece's value as
JSON. A hit copies the files into the output directory, so the output is byte for byte what
drawing them would write. (The grid's run list is kept beside them by ``_runs``.)

The cache is a shortcut, never a source of truth: an entry that does not read back whole (a
file missing, its bytes not those recorded, the value unreadable) is ignored with one warning
line and the piece is computed again; an entry is written to a temporary directory and renamed
into place, so a reader sees all of it or none. Only the ``KEEP`` newest entries are kept.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE_VERSION = 1
KEEP = 16  # entries (each a few MB of PNG at 1,000 trials)
LIBRARIES = ("matplotlib", "numpy", "optuna", "scikit-learn", "scipy", "pillow")


def cache_dir() -> Path | None:
    """Where entries live; None when caching is off (``ABLATE_CACHE_DIR`` set to ``off``)."""
    env = os.environ.get("ABLATE_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ablate" / "compare"


@lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """The compare and stats packages' source and the drawing/fitting libraries' versions: a
    change to either is a different key, so no entry outlives the code that made it."""
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    pkg = Path(__file__).resolve().parent
    for path in sorted([*pkg.glob("*.py"), *(pkg.parent / "stats").glob("*.py")]):  # stats: survival curves
        h.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes())
    for lib in LIBRARIES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            h.update(f"{lib}={metadata.version(lib)}".encode())
    return h.hexdigest()


def _pickled(value: Any) -> bytes:
    """``value`` pickled without the memo (``Pickler.fast``): an object met twice is written
    twice, so equal values pickle alike whichever objects they share (a list of runs read from
    MLflow shares its strings, the same list read back from JSON does not)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True
    pickler.dump(value)
    return buf.getvalue()


def key(name: str, inputs: Any) -> str:
    """The key of piece ``name`` on ``inputs`` (plain data and dataclasses). Pickled only to be
    hashed (nothing pickled is stored): equal inputs pickle alike, so a miss is the worst an
    unusual pickling (a dict in another order) can cause, never a wrong hit."""
    h = hashlib.sha256(_code_fingerprint().encode() + name.encode())
    h.update(_pickled(inputs))
    return h.hexdigest()


def digest(value: Any) -> str:
    """A stand-in for a large input (the trials' results) in several pieces' keys: hashed once
    here instead of once per piece."""
    return hashlib.sha256(_pickled(value)).hexdigest()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(entry: Path, out: Path) -> tuple[bool, Any]:
    """(True, value) with the entry's files copied into ``out``, or (False, None)."""
    meta_path = entry / "entry.json"
    if not meta_path.is_file():
        return False, None
    try:
        meta = json.loads(meta_path.read_text())
        files = {str(k): str(v) for k, v in meta["files"].items()}
        if meta.get("version") != CACHE_VERSION or any(
                Path(n).name != n or _sha(entry / n) != sha for n, sha in files.items()):
            raise ValueError("files do not match their record")
        value = meta["value"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("compare cache entry %s is damaged (%s): ignored, computed again", entry.name, exc)
        shutil.rmtree(entry, ignore_errors=True)  # so the piece computed now can take its place
        return False, None
    try:
        for n in files:
            shutil.copyfile(entry / n, out / n)
    except OSError as exc:  # pruned by another compare meanwhile: drawn again, written over
        log.warning("compare cache entry %s could not be read (%s): computed again", entry.name, exc)
        return False, None
    return True, value


def _store(root: Path, k: str, out: Path, files: Sequence[str], value: Any) -> None:
    """Write the entry atomically (a temporary directory renamed into place); never fails compare."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{k[:12]}-", dir=root))
        present = [n for n in files if (out / n).is_file()]
        for n in present:
            shutil.copyfile(out / n, tmp / n)
        (tmp / "entry.json").write_text(json.dumps({"version": CACHE_VERSION, "value": value,
                                                    "files": {n: _sha(tmp / n) for n in present}}))
        try:
            os.rename(tmp, root / k)
        except OSError:  # another compare stored the same key first
            shutil.rmtree(tmp, ignore_errors=True)
        entries = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, TypeError, ValueError) as exc:
        log.warning("could not cache compare's %s: %s", k[:12], exc)


def reuse(name: str, inputs: Any, out: Path, files: Sequence[str], compute: Callable[[], Callable[[], Any]],
          *, encode: Callable[[Any], Any] = lambda v: v,
          decode: Callable[[Any], Any] = lambda v: v) -> Callable[[], Any]:
    """``compute()`` (which starts the piece and returns a function waiting for its value), or
    the cached value and ``files`` (names under ``out``) when ``inputs`` were seen before.
    ``encode``/``decode``: the value to and from JSON."""
    root = cache_dir()
    if root is None:
        return compute()
    k = key(name, inputs)
    hit, value = _load(root / k, out)
    if hit:
        with contextlib.suppress(OSError):
            os.utime(root / k)  # the newest entries are the ones kept
        decoded = decode(value)
        return lambda: decoded
    wait = compute()

    def finish() -> Any:
        result = wait()
        _store(root, k, out, files, encode(result))
        return result
    return finish


def reuse_figure(name: str, inputs: Any, path: Path, draw: Callable[[], Path | None]) -> Path | None:
    """``draw()`` (one figure at ``path``, or None when it has nothing to show), or its bytes
    reused while ``inputs`` are unchanged (``reuse``)."""
    def now() -> Callable[[], Path | None]:
        drawn = draw()
        return lambda: drawn
    wait = reuse(name, inputs, path.parent, [path.name], now,
                 encode=lambda p: p and p.name, decode=lambda n: n and path.parent / n)
    return wait()
