"""One Slurm status poller for all the jobs this orchestrator watches (issue 38 item 7).

Each attempt's watcher (``launcher._Follow``) asks ``state(job_id)`` once a second; the poller
answers from its cache and refreshes *all* watched jobs with one ``SlurmClient.states`` call
(one ``squeue -j id1,id2,...`` and, for the jobs the controller no longer lists, one
``sacct``) when the cache is due. The refresh interval backs off while nothing changes
(``MIN_S`` doubling up to ``MAX_S``) and drops back to ``MIN_S`` when any job's state changes
or a new job is watched, so the controller sees at most one call per ``MIN_S`` whatever the
number of trials.

Watchers run in Ray Tune trials (one Ray worker process each), so the poller they share is a
named Ray actor (``num_cpus=0``: it never takes a pool's slot) created by the first watcher
(``get_if_exists``); outside Ray (``ablate run-trial``) it is one per process.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.slurm.client import JobState, SlurmClient, SlurmError

log = logging.getLogger(__name__)

MIN_S = 1.0  # the interval after a change: never more than one refresh per MIN_S
MAX_S = 10.0  # the longest interval while nothing changes
FACTOR = 2.0
# A job that no watcher asked about for this long is dropped (its watcher died unseen).
IDLE_S = 120.0
ACTOR = "ablate-slurm-poller"


class StatusPoller:
    """The cache of the watched jobs' states and its refresh with backoff (thread-safe: one
    refresh at a time; a caller that finds a refresh under way gets the cached answer)."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.monotonic,
                 min_s: float = MIN_S, max_s: float = MAX_S, factor: float = FACTOR) -> None:
        self.client, self.clock = client, clock
        self.min_s, self.max_s, self.factor = min_s, max_s, factor
        self.interval = min_s
        self.refreshed_at: float | None = None
        self.refreshes = 0
        self._states: dict[str, JobState] = {}
        self._asked: dict[str, float] = {}  # job -> when a watcher last asked
        self._lock = threading.Lock()  # the dicts
        self._refreshing = threading.Lock()  # one refresh at a time

    def state(self, job_id: str) -> JobState | None:
        """The job's state at the last refresh (refreshing first when due); None while it
        has not been polled yet or when neither squeue nor sacct knows it."""
        now = self.clock()
        with self._lock:
            if job_id not in self._asked:
                self.interval = self.min_s  # a new job: seen at the next MIN_S
            self._asked[job_id] = now
            due = self.refreshed_at is None or now - self.refreshed_at >= self.interval
        if due and self._refreshing.acquire(blocking=False):
            try:
                self._refresh()
            finally:
                self._refreshing.release()
        with self._lock:
            return self._states.get(job_id)

    def forget(self, job_id: str) -> None:
        """The watcher of ``job_id`` is done: no more polls for it."""
        with self._lock:
            self._asked.pop(job_id, None)
            self._states.pop(job_id, None)

    def watched(self) -> list[str]:
        with self._lock:
            return sorted(self._asked)

    def _refresh(self) -> None:
        now = self.clock()
        with self._lock:
            for job in [j for j, t in self._asked.items() if now - t > IDLE_S]:
                self._asked.pop(job)
                self._states.pop(job, None)
            ids = list(self._asked)
            if self.refreshed_at is not None and now - self.refreshed_at < self.interval:
                return  # another caller refreshed meanwhile
        try:
            got = self.client.states(ids) if ids else {}
        except SlurmError as exc:
            # A controller that gave no answer (slow under load, restarting) says nothing about
            # the jobs: each keeps the state it was last seen in, and a job never seen yet stays
            # unknown. Emptying the cache here made a watcher count a running job as lost after
            # 30 s of a slow controller, cancel it and start it again as a new job.
            log.warning("slurm: status of %d jobs failed (their last known states stay): %s",
                        len(ids), exc)
            with self._lock:
                got = dict(self._states)
        with self._lock:
            got = {j: s for j, s in got.items() if j in self._asked}
            changed = got != {j: s for j, s in self._states.items() if j in self._asked}
            self._states = got
            self.refreshed_at = self.clock()
            self.refreshes += 1
            self.interval = self.min_s if changed else min(self.interval * self.factor,
                                                           self.max_s)


# ---------------------------------------------------------------------- shared pollers

_LOCAL: dict[str, StatusPoller] = {}
_LOCAL_LOCK = threading.Lock()


def _conf() -> str:
    return os.environ.get("SLURM_CONF", "")


def local_poller(client: Any = None) -> StatusPoller:
    """This process's poller of the cluster in ``SLURM_CONF`` (or of ``client``, not shared)."""
    if client is not None:
        return StatusPoller(client)
    with _LOCAL_LOCK:
        poller = _LOCAL.get(_conf())
        if poller is None:
            poller = _LOCAL[_conf()] = StatusPoller(SlurmClient())
        return poller


class _PollerActor:
    """The Ray actor: a ``StatusPoller`` of one cluster shared by this Ray's watchers."""

    def __init__(self, conf: str) -> None:
        if conf:
            os.environ["SLURM_CONF"] = conf
        self.poller = StatusPoller(SlurmClient())

    def state(self, job_id: str) -> JobState | None:
        return self.poller.state(job_id)

    def forget(self, job_id: str) -> None:
        self.poller.forget(job_id)

    def stats(self) -> dict[str, Any]:
        return {"refreshes": self.poller.refreshes, "interval": self.poller.interval,
                "watched": len(self.poller.watched())}


class ActorPoller:
    """A watcher's handle on the shared actor; the actor is created again (and this call
    retried once) if it died with the trial worker that owned it. Should that fail too, this
    watcher goes on with its own process's poller (one more squeue stream, never a lost job)."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.conf = _conf()
        self._last: dict[str, JobState | None] = {}  # job -> the actor's last answer
        self.name = f"{ACTOR}-{hashlib.sha256(self.conf.encode()).hexdigest()[:12]}"
        self._actor: Any = None
        self._fallback: StatusPoller | None = None

    def _handle(self) -> Any:
        import ray

        if self._actor is None:
            cls = ray.remote(num_cpus=0, max_restarts=0)(_PollerActor)
            self._actor = cls.options(name=self.name, get_if_exists=True).remote(self.conf)
        return self._actor

    def _call(self, method: str, job_id: str) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        for attempt in (0, 1):
            if self._fallback is not None:
                return getattr(self._fallback, method)(job_id)
            try:
                return ray.get(getattr(self._handle(), method).remote(job_id),
                               timeout=self.timeout)
            except RayActorError:
                self._actor = None
                if attempt:
                    log.warning("slurm: the shared status poller died twice; this watcher "
                                "polls on its own")
                    self._fallback = local_poller()
                    return getattr(self._fallback, method)(job_id)
            except GetTimeoutError:
                # No answer is not "the job is gone": the caller gets the last one it had.
                log.warning("slurm: the shared status poller gave no answer in %.0f s",
                            self.timeout)
                return self._last.get(job_id) if method == "state" else None
        return None

    def state(self, job_id: str) -> JobState | None:
        self._last[job_id] = got = self._call("state", job_id)
        return got

    def forget(self, job_id: str) -> None:
        self._last.pop(job_id, None)
        self._call("forget", job_id)


def shared_poller(client: Any = None) -> Any:
    """The poller a watcher asks: the Ray actor inside a Ray worker, else this process's.
    A given ``client`` (tests) gets its own in-process poller."""
    if client is None and "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return ActorPoller()
    return local_poller(client)
