"""Slurm controller calls per second while 500 trials' jobs are watched (issue 38 item 7).

On the test cluster of ``tests/slurm/cluster.py`` (one slurmctld, two slurmd, started here and
stopped by pid at the end), ``--jobs`` batch jobs are submitted held (``sbatch --hold``: they
stay PENDING, nothing runs) and each is watched by one watcher thread that asks for its job's
state once a second, as ``launcher._Follow`` does, for a window of seconds:

- ``old``: each watcher calls ``SlurmClient.state`` (one ``scontrol show job`` per job per
  poll: the backend before issue 38);
- ``new``: each watcher asks the shared ``poller.StatusPoller`` (one ``squeue`` for all jobs
  per refresh, backing off from 1 s to 10 s while nothing changes). Halfway through the window
  one job is cancelled, so the window holds a change (the interval drops back to 1 s).

Old runs first, then new, in the same cluster. Counted: the client's calls (squeue, scontrol,
sacct processes) and the controller's RPCs from ``sdiag`` before and after each window (its
own REQUEST_STATS_INFO left out). Every job made here is cancelled at the end. Goal: new <= 1
controller call per second.

    python benchmarks/slurm_controller_load.py [--jobs 500] [--old-s 20] [--new-s 60] \
        [--json results/benchmarks/slurm_controller_load.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "slurm"))

import cluster as test_cluster

from orchestrator.slurm.client import SlurmClient
from orchestrator.slurm.poller import StatusPoller


class CountingClient(SlurmClient):
    """A ``SlurmClient`` that counts the processes it starts, by executable."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def _run(self, argv, *, check=True):  # type: ignore[override]
        with self._lock:
            self.calls[argv[0]] += 1
        return super()._run(argv, check=check)


def rpcs(c: test_cluster.Cluster) -> dict[str, int]:
    """sdiag's RPC counts by message type."""
    out = c.run(["sdiag"])
    section = out.split("by message type", 1)[1].split("by user", 1)[0]
    return {m: int(n) for m, n in re.findall(r"(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section)}


def rpc_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    keys = set(before) | set(after)
    out = {k: after.get(k, 0) - before.get(k, 0) for k in keys if k != "REQUEST_STATS_INFO"}
    return {k: v for k, v in sorted(out.items()) if v}


def watch(jobs: list[str], ask, seconds: float, midway=None) -> dict[str, float]:
    """One thread per job asking ``ask(job)`` once a second for ``seconds``."""
    stop = threading.Event()
    asked = collections.Counter()

    def watcher(job: str) -> None:
        while not stop.is_set():
            ask(job)
            asked[job] += 1
            stop.wait(1.0)

    threads = [threading.Thread(target=watcher, args=(j,), daemon=True) for j in jobs]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    if midway:
        stop.wait(seconds / 2)
        midway()
        stop.wait(max(0.0, seconds - (time.monotonic() - t0)))
    else:
        stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 2), "asks": sum(asked.values())}


def measure(c: test_cluster.Cluster, jobs: list[str], mode: str, seconds: float) -> dict:
    client = CountingClient()
    poller = StatusPoller(client)
    intervals: list[float] = []
    if mode == "old":
        ask = client.state
        midway = None
    else:
        def ask(job: str) -> None:
            poller.state(job)

        def midway() -> None:
            intervals.append(poller.interval)  # backed off by now
            c.run(["scancel", jobs[0]])  # a change: the interval drops back to 1 s

    before = rpcs(c)
    got = watch(jobs, ask, seconds, midway)
    after = rpcs(c)
    delta = rpc_delta(before, after)
    calls = dict(client.calls)
    ctl_calls = calls.get("squeue", 0) + calls.get("scontrol", 0)
    out = {"mode": mode, "window_s": got["wall_s"], "watcher_asks": got["asks"],
           "client_calls": calls,
           "controller_calls_per_s": round(ctl_calls / got["wall_s"], 3),
           "sacct_calls_per_s": round(calls.get("sacct", 0) / got["wall_s"], 3),
           "sdiag_rpcs": delta,
           "sdiag_rpcs_per_s": round(sum(delta.values()) / got["wall_s"], 3)}
    if mode == "new":
        out["refreshes"] = poller.refreshes
        out["interval_before_change_s"] = intervals[0] if intervals else None
        out["interval_at_end_s"] = poller.interval
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--old-s", type=float, default=20.0)
    p.add_argument("--new-s", type=float, default=60.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    reason = test_cluster.missing()
    if reason:
        sys.exit(f"slurm_controller_load: {reason}")
    root = Path(tempfile.mkdtemp(prefix="slurm-load-", dir="/tmp"))
    c = test_cluster.Cluster(root, extra=("MaxJobCount=20000",))
    jobs: list[str] = []
    try:
        c.start()
        os.environ["SLURM_CONF"] = str(c.conf)
        script = root / "held.sbatch"
        script.write_text("#!/bin/bash\ntrue\n")
        t0 = time.monotonic()

        def submit(i: int) -> str:
            return c.run(["sbatch", "--parsable", "--hold", "-p", "pa", "-J", f"load-{i}",
                          f"--output={root}/out-%j", str(script)]).strip().split(";")[0]

        with ThreadPoolExecutor(8) as pool:
            jobs = list(pool.map(submit, range(args.jobs)))
        submit_s = time.monotonic() - t0
        pending = c.run(["squeue", "-h", "-t", "PENDING", "-o", "%i"]).split()
        assert set(jobs) <= set(pending), "the held jobs are not all PENDING"
        old = measure(c, jobs, "old", args.old_s)
        new = measure(c, jobs[:], "new", args.new_s)
        out = {"benchmark": "slurm_controller_load", "jobs_pending": len(jobs),
               "watchers": len(jobs), "watcher_poll_s": 1.0, "order": "old first, then new",
               "submit_s": round(submit_s, 1),
               "slurm": c.run(["sinfo", "--version"]).strip(),
               "cluster": "tests/slurm/cluster.py: 1 slurmctld + 2 slurmd on this machine",
               "cpus": os.cpu_count(), "old": old, "new": new,
               "reduction": (round(old["controller_calls_per_s"]
                                   / new["controller_calls_per_s"], 1)
                             if new["controller_calls_per_s"] else None),
               "goal": "new controller_calls_per_s <= 1",
               "note": ("controller_calls: squeue + scontrol processes the watchers' client "
                        "started (sacct asks slurmdbd, counted apart); sdiag_rpcs: all RPCs "
                        "slurmctld served in the window (each squeue is a JOB_INFO and a "
                        "PARTITION_INFO, each scontrol show job a JOB_INFO_SINGLE and a "
                        "FED_INFO; new's window includes the one scancel of its change)"),
               "loadavg": Path("/proc/loadavg").read_text().strip()}
        print(json.dumps(out, indent=2))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=2) + "\n")
    finally:
        for i in range(0, len(jobs), 200):  # every job made here, by id
            subprocess.run(["scancel", *jobs[i:i + 200]], env={**os.environ, **c.env},
                           capture_output=True, timeout=60, check=False)
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
