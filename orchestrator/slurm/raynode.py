"""One Ray worker node of a multi-node trial's job: what ``srun`` runs on each node but the
first (``orchestrator.slurm.raycluster``).

It picks ports free on *this* node, runs ``ray start --address=HEAD --block`` as its child and
waits. On SIGUSR1 or SIGTERM (``srun`` forwards both to its task) it records which Ray worker
processes ran on this node (``ray-node-NODE.json`` in the attempt's log directory, the evidence
that the trial's work reached this node), stops its Ray node and removes the node's temp dir,
which lives on this node's disk where the batch node cannot reach it."""
from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from orchestrator.slurm.raycluster import node_argv, record_node, remove_temp, stop_process


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.slurm.raynode")
    p.add_argument("--address", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--log-dir", required=True, type=Path)
    p.add_argument("--num-cpus", type=int)
    p.add_argument("--num-gpus", type=int)
    a = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cmd = node_argv(temp_dir=a.temp_dir, node=a.node, num_cpus=a.num_cpus, num_gpus=a.num_gpus,
                    address=a.address)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not stop.wait(1.0):
            pass
        record_node(a.log_dir, a.node, a.temp_dir)
    finally:
        # Ray's daemons (raylet, agents) can outlive `ray start` by a moment: wait for each
        # (bounded) and kill what is left, by pid, so the step leaves nothing behind.
        try:
            node = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            node = []
        stop_process(proc)
        _, alive = psutil.wait_procs(node, timeout=15)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        remove_temp(a.temp_dir)
    return 0 if stop.is_set() else (proc.returncode or 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
