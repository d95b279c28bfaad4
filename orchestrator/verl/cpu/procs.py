"""Own, measure and clean up every process a verl job starts (driver, Ray, workers, servers).

Ray's daemons and workers detach from the job's process group, and when the driver exits they
are re-parented away from the launcher, so neither ``killpg`` nor "children of the job" finds
them all. The launcher therefore makes itself a *child subreaper* (Linux ``prctl``) for the
length of the job (:func:`subreaper`): orphaned descendants are re-parented to it instead of to
init, and ``psutil.Process().children(recursive=True)`` is exactly "everything this job started".
That set is what the RSS sampler sums and what :func:`kill_tree` ends -- by pid, never by name, so
other users' Ray clusters on the same machine are untouched.

A subreaper must also *reap*. Ray's workers decide that their raylet is gone by probing its pid,
and a dead raylet that nobody reaps is a zombie, which still answers the probe: the workers then
train on as orphans. So the sampler reaps every orphan that dies while the job runs, and the flag
is dropped when the job ends; a process left a subreaper after its job (a long-lived Ray worker,
a test session) would otherwise keep the zombies of every job killed below it later, and with
them those jobs' workers.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psutil

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def is_subreaper() -> bool:
    """Whether orphaned descendants re-parent to this process (Linux)."""
    prctl, flag = _prctl(), ctypes.c_int(0)
    return bool(prctl and prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
                and flag.value)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Make orphaned descendants re-parent to this process while the block runs (Linux), then
    restore what the process was before; yields False where unsupported."""
    prctl = _prctl()
    before = is_subreaper()
    ok = bool(prctl and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    try:
        yield ok
    finally:
        if ok and not before:
            prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux), or None.

    When the launcher is SIGKILLed (``ablate submit`` killed, its Ray worker gone), the job would
    otherwise run on as an orphan next to the attempt that resumes it. Ray's own processes share
    the fate of the job's driver, so ending the driver ends the job. The libc function is bound
    here, before the fork: the child only calls it (nothing that could take a lock).
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the line above took effect
            os._exit(1)

    return preexec


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


@dataclass
class Peak:
    rss_bytes: int = 0
    processes: int = 0
    at_time: float = 0.0


class RssSampler:
    """Samples the summed RSS of all descendants every ``interval`` seconds in a thread.

    It also keeps each descendant's latest command line (Ray renames its workers
    ``ray::<ActorClass>``), so a run can say which process was which, and reaps the orphans that
    died (see the module's docstring): a zombie child of this process that was first seen with
    another parent. A child this process started itself is never reaped here (its ``Popen``
    waits for it).
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak = Peak()
        self.peak_processes = 0
        self.titles: dict[int, str] = {}
        self.reaped_orphans = 0
        self._first_parent: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> RssSampler:  # noqa: PYI034 - typing.Self needs Python 3.11
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _reap(self, proc: psutil.Process, me: int) -> bool:
        """Reap ``proc`` if it is a dead orphan re-parented to this process."""
        parent = proc.ppid()
        first = self._first_parent.setdefault(proc.pid, parent)
        if parent != me or first == me or proc.status() != psutil.STATUS_ZOMBIE:
            return False
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, os.WNOHANG)
            self.reaped_orphans += 1
        return True

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total, count = 0, 0
            for proc in descendants():
                try:
                    if self._reap(proc, me):
                        continue
                    total += proc.memory_info().rss
                    count += 1
                    title = " ".join(proc.cmdline())[:120]
                    if title or proc.pid not in self.titles:  # an exiting process has none
                        self.titles[proc.pid] = title
                except psutil.Error:
                    continue
            if total > self.peak.rss_bytes:
                self.peak = Peak(total, count, time.monotonic() - self._t0)
            self.peak_processes = max(self.peak_processes, count)
            self._stop.wait(self.interval)


def kill_tree(grace: float = 10.0, keep: frozenset[int] = frozenset()) -> list[int]:
    """SIGTERM every descendant not in ``keep`` (those that existed before the job started),
    SIGKILL what is left after ``grace`` seconds; returns their pids."""
    procs = [p for p in descendants() if p.pid not in keep]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    # Reap zombies that were re-parented to us.
    for proc in descendants():
        if proc.pid in keep:
            continue
        try:
            proc.wait(timeout=0)
        except (psutil.Error, psutil.TimeoutExpired):
            pass
    return [p.pid for p in procs]
