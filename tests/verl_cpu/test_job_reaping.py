"""The verl launcher's process ownership (``orchestrator/verl/cpu/procs.py``), without verl.

A launcher is a child subreaper only while its job runs, and it reaps the job's orphans as they
die. Both matter to Ray's fate-sharing: a Ray worker decides that its raylet is gone by probing
the raylet's pid, and an unreaped dead raylet (a zombie) still answers the probe. A process left
a subreaper after a job (it was, once: a whole CI session) kept the zombies of a verl job killed
below it, and that job's workers trained on as orphans.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from orchestrator.verl.cpu import procs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")


def _alive_by_probe(pid: int) -> bool:
    """What a Ray worker asks of its raylet: does ``kill(pid, 0)`` find the pid?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_subreaper_flag_lasts_only_as_long_as_the_block() -> None:
    assert not procs.is_subreaper()
    with procs.subreaper() as ok:
        assert ok and procs.is_subreaper()
    assert not procs.is_subreaper()


def test_an_orphan_that_dies_during_the_job_is_reaped_at_once() -> None:
    with procs.subreaper(), procs.RssSampler(interval=0.05) as sampler:
        # The shell starts a sleeper, lives on for a while (the sampler sees the sleeper as the
        # shell's child, as it sees Ray's raylet as the verl driver's) and exits: the sleeper is
        # orphaned and comes back to us.
        out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!; sleep 0.5"],
                             capture_output=True, text=True, check=True)
        orphan = int(out.stdout.strip())
        assert psutil.Process(orphan).ppid() == os.getpid()
        deadline = time.monotonic() + 10
        os.kill(orphan, 9)
        while _alive_by_probe(orphan):
            assert time.monotonic() < deadline, "the dead orphan stayed a zombie"
            time.sleep(0.02)
    assert sampler.reaped_orphans >= 1


def test_a_child_the_launcher_started_is_left_to_its_popen() -> None:
    with procs.subreaper(), procs.RssSampler(interval=0.02):
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        time.sleep(0.5)  # dead (a zombie) for several sampler rounds before the wait
        assert child.wait(timeout=10) == 3  # its exit code, not ECHILD's 0
