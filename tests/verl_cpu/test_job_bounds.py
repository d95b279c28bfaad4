"""A verl job that will not progress ends in bounded time, and the shared memory it made goes
(orchestrator/verl/cpu/shm.py, supervise._LogWatch): fast, no job starts."""
from __future__ import annotations

import mmap
import time
from multiprocessing import shared_memory
from pathlib import Path

from orchestrator.verl import supervise
from orchestrator.verl.cpu import shm


def test_new_unmapped_segments_are_removed_others_kept(tmp_path: Path) -> None:
    (tmp_path / "verl_weights_old").write_bytes(b"x")
    (tmp_path / "other_new").write_bytes(b"x")
    before = shm.snapshot(tmp_path)
    assert before == {"verl_weights_old"}
    (tmp_path / "verl_weights_new").write_bytes(b"x" * 4096)
    (tmp_path / "psm_new").write_bytes(b"x")
    busy = tmp_path / "verl_weights_busy"
    busy.write_bytes(b"x" * 4096)
    with open(busy, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):  # a live process maps it
        removed = shm.remove_new(before, tmp_path)
    assert removed == ["psm_new", "verl_weights_new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other_new", "verl_weights_busy", "verl_weights_old"]


def test_a_left_segment_in_dev_shm_is_removed() -> None:
    before = shm.snapshot()
    seg = shared_memory.SharedMemory(name=f"verl_weights_test{time.time_ns()}", create=True,
                                     size=4096)
    name = seg.name.lstrip("/")
    seg.close()  # what a job killed mid-sync leaves: closed, never unlinked
    try:
        assert name in shm.remove_new(before)
        assert not (shm.SHM / name).exists()
    finally:
        if (shm.SHM / name).exists():
            (shm.SHM / name).unlink()


def test_a_fatal_line_ends_the_watch(tmp_path: Path) -> None:
    log = tmp_path / "verl.log"
    log.write_text("starting\n")
    watch = supervise._LogWatch(log, stall=None)
    assert watch.problem() is None
    with log.open("a") as fh:
        fh.write("(WorkerDict pid=1) AttributeError: 'Parameter' object has no attribute "
                 "'weight_loader'\n")
    assert "weight_loader" in (watch.problem() or "")


def test_no_step_for_the_bound_is_a_hang(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "verl.log"
    log.write_text("")
    assert supervise._stall_seconds("cpu") == supervise.STALL_SECONDS["cpu"]
    assert supervise._stall_seconds("gpu") is None
    monkeypatch.setenv(supervise.STALL_ENV, "0.2")
    watch = supervise._LogWatch(log, supervise._stall_seconds("gpu"))
    assert watch.problem() is None
    time.sleep(0.3)
    assert "no step for 0 s" in (watch.problem() or "") or "hung" in (watch.problem() or "")
    watch.progress()
    assert watch.problem() is None
