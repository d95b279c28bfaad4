"""Checkpoint store of one trial: atomic saves, verified reads, retention.

A checkpoint is a directory ``step-00000025/`` holding whatever the backend wrote plus a
``MANIFEST.json`` (file sizes and SHA-256). A checkpoint exists only when its manifest exists and
matches the files, so a crash mid-save never leaves something that looks usable:

* local store (default, ``TrialPaths.checkpoints``): files are written into a hidden temp
  directory, the manifest last, then the directory is renamed into place (atomic on POSIX);
* fsspec URL (``checkpoint.store: s3://bucket/prefix``, ``memory://``, ...): object stores have
  no rename, so the files are uploaded first and the manifest last; readers ignore a step without
  a manifest. Reads download into a local cache and verify there.

Retention keeps the newest ``keep`` checkpoints plus every protected step (the runner protects
the newest checkpoint saved while the trial still looked healthy, which ``ablate resume`` needs).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from orchestrator.exceptions import CheckpointError
from orchestrator.store._files import SCHEMA_VERSION, atomic_write_json, read_json

MANIFEST = "MANIFEST.json"
RETENTION = "RETENTION.json"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_CHUNK = 1 << 20


def link_tree(src: Path, dst: Path) -> None:
    """Copy a checkpoint directory by hard links (same filesystem) or by copying: how a trainer
    hands its job's checkpoint to the store and lays a stored one out for its job to resume."""
    for root, _dirs, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, target / name)
            except OSError:
                shutil.copy2(Path(root) / name, target / name)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _build_manifest(root: Path, trial_id: str, step: int) -> dict[str, Any]:
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(root).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return {"schema_version": SCHEMA_VERSION, "trial_id": trial_id, "step": step,
            "created_at": time.time(), "files": files}


def _check_dir(root: Path, manifest: dict[str, Any], *, hashes: bool) -> str | None:
    """What is wrong with the checkpoint at ``root`` against its manifest, or None."""
    for rel, meta in manifest.get("files", {}).items():
        p = root / rel
        if not p.is_file():
            return f"file {rel} is missing"
        if p.stat().st_size != meta["size"]:
            return f"file {rel} has {p.stat().st_size} bytes, the manifest says {meta['size']}"
        if hashes and _sha256(p) != meta["sha256"]:
            return f"file {rel} does not match its SHA-256 in the manifest"
    return None


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class CheckpointStore:
    """Checkpoints of one trial under ``root`` (a local directory or an fsspec URL)."""

    def __init__(self, root: str | os.PathLike[str], *, trial_id: str, keep: int = 3,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.trial_id = trial_id
        self.keep = max(1, int(keep))
        text = os.fspath(root)
        self.is_local = "://" not in text or text.startswith("file://")
        if self.is_local:
            self.root = Path(text.removeprefix("file://")).expanduser().resolve()
            self.fs: Any = None
        else:
            import fsspec

            self.fs, self.root_url = fsspec.core.url_to_fs(text.rstrip("/"))
            self.root = Path(cache_dir or tempfile.gettempdir()) / "ablate-ckpt-cache" / trial_id
        self.url = text

    @classmethod
    def for_trial(cls, store: str | None, trial_dir: Path, trial_id: str, keep: int) -> CheckpointStore:
        """The store a grid's ``checkpoint:`` section names: ``store/<trial_id>`` or the trial dir."""
        if store is None:
            return cls(trial_dir / "checkpoints", trial_id=trial_id, keep=keep)
        return cls(store.rstrip("/") + "/" + trial_id, trial_id=trial_id, keep=keep,
                   cache_dir=trial_dir / ".checkpoint-cache")

    # ------------------------------------------------------------------ writing

    def save(self, step: int, write: Callable[[Path], None]) -> Path | str:
        """Write the checkpoint of ``step`` atomically; returns its location."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        name = step_dir_name(step)
        if self.is_local:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{name}.", suffix=".tmp"))
            try:
                write(tmp)
                atomic_write_json(tmp / MANIFEST, _build_manifest(tmp, self.trial_id, step))
                _fsync_tree(tmp)
                final = self.root / name
                if final.exists():
                    # Re-saving a step (a resumed attempt passing it again): replace it whole.
                    shutil.rmtree(final)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return final
        with tempfile.TemporaryDirectory(prefix=f"{name}.") as tmpdir:
            tmp = Path(tmpdir)
            write(tmp)
            manifest = _build_manifest(tmp, self.trial_id, step)
            target = f"{self.root_url}/{name}"
            if self.fs.exists(f"{target}/{MANIFEST}"):
                self.fs.rm(f"{target}/{MANIFEST}")  # invalidate first, then overwrite
            for rel in manifest["files"]:
                self.fs.put_file(str(tmp / rel), f"{target}/{rel}")
            # The manifest goes last: its presence is what makes the checkpoint exist.
            self.fs.pipe_file(f"{target}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
            return target

    # ------------------------------------------------------------------ reading

    def _listed_steps(self) -> list[int]:
        if self.is_local:
            names = [p.name for p in self.root.iterdir()] if self.root.is_dir() else []
        else:
            try:
                names = [n.rstrip("/").rsplit("/", 1)[-1] for n in self.fs.ls(self.root_url, detail=False)]
            except FileNotFoundError:
                names = []
        return sorted(int(m.group(1)) for n in names if (m := _STEP_DIR.match(n)))

    def _manifest(self, step: int) -> dict[str, Any] | None:
        try:
            if self.is_local:
                data = read_json(self.root / step_dir_name(step) / MANIFEST)
            else:
                data = json.loads(self.fs.cat_file(f"{self.root_url}/{step_dir_name(step)}/{MANIFEST}"))
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("step") != step or not isinstance(data.get("files"), dict):
            return None
        return data

    def _problem(self, step: int, *, hashes: bool) -> str | None:
        manifest = self._manifest(step)
        if manifest is None:
            return "it has no valid MANIFEST.json (incomplete or corrupt save)"
        if self.is_local:
            return _check_dir(self.root / step_dir_name(step), manifest, hashes=hashes)
        prefix = f"{self.root_url}/{step_dir_name(step)}"
        for rel, meta in manifest["files"].items():
            try:
                size = self.fs.size(f"{prefix}/{rel}")
            except FileNotFoundError:
                return f"file {rel} is missing"
            if size != meta["size"]:
                return f"file {rel} has {size} bytes, the manifest says {meta['size']}"
        return None

    def steps(self) -> list[int]:
        """Steps of complete checkpoints (manifest present, every file present with its size)."""
        return [s for s in self._listed_steps() if self._problem(s, hashes=False) is None]

    def damaged(self) -> dict[int, str]:
        """The checkpoints ``steps`` leaves out (a garbled manifest, a truncated or missing
        file), each with what is wrong: a reader that would use them says so."""
        return {s: p for s in self._listed_steps() if (p := self._problem(s, hashes=False))}

    def verify(self, step: int) -> str | None:
        """What is wrong with checkpoint ``step`` (hashes included), or None if it is sound."""
        if step not in self._listed_steps():
            return "it does not exist"
        return self._problem(step, hashes=True)

    def path(self, step: int) -> Path:
        """A local directory with the verified checkpoint of ``step``; ``CheckpointError`` if bad."""
        problem = self.verify(step) if self.is_local else self._fetch(step)
        if problem is not None:
            # Only checkpoints that verify (hashes too), never the broken one itself.
            have = [s for s in self.steps() if s != step and (
                self._problem(s, hashes=True) is None if self.is_local else self._fetch(s) is None)]
            hint = (f"usable checkpoints: steps {have}" if have
                    else "no other checkpoint verifies: start the trial afresh (--fresh)")
            raise CheckpointError(f"trial {self.trial_id}: checkpoint step {step} in {self.url}: "
                                  f"{problem}; {hint}")
        return self.root / step_dir_name(step)

    def _fetch(self, step: int) -> str | None:
        problem = self._problem(step, hashes=False)
        if problem is not None:
            return problem if step in self._listed_steps() else "it does not exist"
        local = self.root / step_dir_name(step)
        manifest = self._manifest(step)
        assert manifest is not None
        if local.exists() and _check_dir(local, manifest, hashes=True) is None:
            return None
        shutil.rmtree(local, ignore_errors=True)
        self.fs.get(f"{self.root_url}/{step_dir_name(step)}/", str(local) + "/", recursive=True)
        return _check_dir(local, manifest, hashes=True)

    def latest(self, before: int | None = None) -> int | None:
        """The newest sound checkpoint step (``< before`` if given); corrupt ones are skipped."""
        for step in reversed(self.steps()):
            if before is not None and step >= before:
                continue
            if self.is_local and self._problem(step, hashes=True) is not None:
                continue
            if not self.is_local and self._fetch(step) is not None:
                continue
            return step
        return None

    # ------------------------------------------------------------------ retention

    def protected(self) -> set[int]:
        try:
            if self.is_local:
                data = read_json(self.root / RETENTION)
            else:
                data = json.loads(self.fs.cat_file(f"{self.root_url}/{RETENTION}"))
        except (FileNotFoundError, ValueError):
            return set()
        return {int(s) for s in data.get("protected", [])}

    def protect(self, steps: Iterable[int]) -> None:
        """Replace the set of protected steps (kept whatever ``keep`` says)."""
        data = {"schema_version": SCHEMA_VERSION, "protected": sorted(set(steps))}
        if self.is_local:
            atomic_write_json(self.root / RETENTION, data)
        else:
            self.fs.pipe_file(f"{self.root_url}/{RETENTION}", json.dumps(data).encode())

    def clear(self) -> None:
        """Delete every checkpoint of the trial (a fresh start discards the old run)."""
        for step in self._listed_steps():
            self._remove(step)
        self.protect([])

    def drop_after(self, step: int) -> list[int]:
        """Delete checkpoints newer than ``step``: resuming from ``step`` abandons the branch they
        belong to, and a later ``latest()`` (an infra retry) must not pick one of them up."""
        gone = [s for s in self._listed_steps() if s > step]
        for s in gone:
            self._remove(s)
        if gone:
            self.protect(s for s in self.protected() if s <= step)
        return gone

    def _remove(self, step: int) -> None:
        if self.is_local:
            shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)
        else:
            self.fs.rm(f"{self.root_url}/{step_dir_name(step)}", recursive=True)

    def prune(self) -> list[int]:
        """Delete checkpoints beyond the newest ``keep`` that are not protected; returns them."""
        complete = self.steps()
        keep = set(complete[-self.keep:]) | self.protected()
        removed = []
        for step in self._listed_steps():
            if step in keep:
                continue
            if step > max(complete, default=-1):
                continue  # a save in progress elsewhere, or a partial newer step: not ours to judge
            self._remove(step)
            removed.append(step)
        if self.is_local and self.root.is_dir():
            for tmp in self.root.glob(".step-*.tmp"):
                # Leftovers of saves killed mid-write; a live save uses a fresh, younger name.
                if time.time() - tmp.stat().st_mtime > 3600:
                    shutil.rmtree(tmp, ignore_errors=True)
        return removed
