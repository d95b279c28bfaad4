"""Checkpoint store: atomic saves, manifest verification, retention, fsspec stores."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from orchestrator.exceptions import CheckpointError
from orchestrator.store import MANIFEST, CheckpointStore, read_json, step_dir_name


def _writer(payload: bytes, extra: dict[str, bytes] | None = None):
    def write(d: Path) -> None:
        (d / "model.bin").write_bytes(payload)
        (d / "sub").mkdir()
        for name, data in (extra or {}).items():
            (d / "sub" / name).write_bytes(data)

    return write


def test_save_writes_manifest_and_verifies(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="t1", keep=3)
    store.save(5, _writer(b"abc" * 1000, {"opt.bin": b"xyz"}))
    manifest = read_json(tmp_path / "ck" / step_dir_name(5) / MANIFEST)
    assert manifest["step"] == 5 and manifest["trial_id"] == "t1"
    assert manifest["files"]["model.bin"]["size"] == 3000
    assert set(manifest["files"]) == {"model.bin", "sub/opt.bin"}
    assert store.steps() == [5]
    assert (store.path(5) / "model.bin").read_bytes() == b"abc" * 1000
    assert store.latest() == 5 and store.latest(before=5) is None


def test_failed_save_leaves_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="t1")

    def boom(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x")
        raise OSError("disk full (injected)")

    with pytest.raises(OSError):
        store.save(3, boom)
    assert store.steps() == []
    assert list((tmp_path / "ck").iterdir()) == []


def test_corrupt_and_missing_checkpoints_raise_one_line(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="tabc", keep=5)
    for s in (10, 20, 30):
        store.save(s, _writer(bytes([s]) * 100))
    # Same size, different content: only the hash catches it.
    (tmp_path / "ck" / step_dir_name(30) / "model.bin").write_bytes(b"\0" * 100)
    # A truncated file: the size check catches it, so steps() drops it too.
    (tmp_path / "ck" / step_dir_name(20) / "model.bin").write_bytes(b"\1" * 10)
    assert store.steps() == [10, 30]
    with pytest.raises(CheckpointError) as exc:
        store.path(30)
    msg = str(exc.value)
    assert "\n" not in msg and "tabc" in msg and "step 30" in msg and "SHA-256" in msg
    # The hint names only the checkpoints that verify: not 30 (the corrupt one asked for).
    assert msg.endswith("usable checkpoints: steps [10]"), msg
    # Both 10 and 30 broken: no usable checkpoint is named, the way out is a fresh start.
    (tmp_path / "ck" / step_dir_name(10) / "model.bin").write_bytes(b"\2" * 100)
    with pytest.raises(CheckpointError, match=r"step 30 .*no other checkpoint verifies.*--fresh"):
        store.path(30)
    (tmp_path / "ck" / step_dir_name(10) / "model.bin").write_bytes(bytes([10]) * 100)
    with pytest.raises(CheckpointError, match="step 40 .*does not exist"):
        store.path(40)
    # latest() skips the corrupt newest one and falls back to the sound one.
    assert store.latest() == 10


def test_manifest_missing_means_incomplete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="t1")
    store.save(4, _writer(b"a"))
    (tmp_path / "ck" / step_dir_name(4) / MANIFEST).unlink()
    assert store.steps() == []
    with pytest.raises(CheckpointError, match="no valid MANIFEST"):
        store.path(4)


def test_retention_keeps_last_k_plus_protected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="t1", keep=2)
    for s in range(1, 7):
        store.save(s, _writer(bytes([s])))
        if s == 2:
            store.protect([2])
        store.prune()
    assert store.steps() == [2, 5, 6]
    store.protect([])
    store.prune()
    assert store.steps() == [5, 6]


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck", trial_id="t1")
    store.save(3, _writer(b"old"))
    store.save(3, _writer(b"new"))
    assert (store.path(3) / "model.bin").read_bytes() == b"new"


def test_fsspec_store_manifest_last(tmp_path: Path) -> None:
    import fsspec

    url = f"memory://ablate-{uuid.uuid4().hex}/ck"
    store = CheckpointStore(url, trial_id="t9", keep=2, cache_dir=tmp_path / "cache")
    for s in (1, 2, 3):
        store.save(s, _writer(bytes([s]) * 50, {"o.bin": b"o"}))
        store.prune()
    assert store.steps() == [2, 3]
    local = store.path(3)
    assert local.is_dir() and (local / "model.bin").read_bytes() == bytes([3]) * 50
    fs = fsspec.filesystem("memory")
    # A partial upload (no manifest) is not a checkpoint.
    fs.pipe_file(f"{url}/{step_dir_name(4)}/model.bin", b"partial")
    assert store.steps() == [2, 3] and store.latest() == 3
    # Corruption in the remote copy is found after download.
    fs.pipe_file(f"{url}/{step_dir_name(3)}/model.bin", b"\0" * 50)
    import shutil

    shutil.rmtree(local)
    with pytest.raises(CheckpointError, match="SHA-256"):
        store.path(3)
    assert store.latest() == 2
