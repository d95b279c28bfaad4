"""A real Slurm cluster on this machine for the tests: one ``slurmctld`` and two ``slurmd``
(Slurm's multiple-slurmd mode: ``slurmd -N NAME``, one port each), all under a temp directory,
started and stopped by pid.

Node ``n1`` is partition ``pa`` with feature ``fa`` and a typed GRES ``gpu:h100:1``; node ``n2``
is partition ``pb`` with feature ``fb`` and ``gpu:a100:1``, and also partition ``urgent``,
whose jobs preempt (cancel) the jobs of ``pb`` in their way; partition ``duo`` has both (the
multi-node jobs). The GPUs are empty placeholder files
(``gres.conf`` ``File=``): Slurm schedules them, nothing computes on them. ``auth/none`` and
``cred/none`` (both built into Debian's 22.05) replace munge, so no third daemon runs.
``JobCompType=jobcomp/filetxt`` records finished jobs without a database; there is no
accounting storage, so ``sacct`` has nothing and the backend falls back as documented.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from orchestrator.slurm.raycluster import free_ports

DAEMONS = ("slurmctld", "slurmd")
NODES = {"n1": ("pa", "fa", "h100"), "n2": ("pb", "fb", "a100")}


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd runs jobs as their user)"
    for exe in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo"):
        if shutil.which(exe) is None:
            return (f"{exe} is not installed (apt-get install -y slurmctld slurmd "
                    "slurm-client; .ci/run does it as root)")
    return None


class Cluster:
    """The cluster's files under ``root``; ``env`` is what a client needs (``SLURM_CONF``)."""

    def __init__(self, root: Path, *, name: str = "ablate-test",
                 nodes: dict[str, tuple[str, str, str]] | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        """``nodes``: name -> (partition, feature, GPU type), ``NODES`` by default (with the
        ``urgent`` and ``duo`` partitions); ``extra``: slurm.conf lines that replace the lines
        of the same keys (accounting, ``MinJobAge``)."""
        self.root = root
        self.conf = root / "slurm.conf"
        self.pids: dict[str, int] = {}
        self.env = {"SLURM_CONF": str(self.conf)}
        self.name, self.nodes, self.extra = name, nodes or NODES, extra

    def write_config(self) -> None:
        host = socket.gethostname()
        ctl, *node_ports = free_ports(1 + len(self.nodes), host="127.0.0.1")
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        (self.root / "dev").mkdir(exist_ok=True)
        lines = [
            f"ClusterName={self.name}", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ctl}",
            "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={self.root}/state", f"SlurmdSpoolDir={self.root}/spool-%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin", "SchedulerParameters=sched_interval=1",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.root}/jobcomp.txt",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "ReturnToService=2", "GresTypes=gpu",
            # Finished jobs stay visible to `scontrol show job` for 10 minutes (no accounting).
            # A slurmd on a machine busy with verl jobs and another test worker may answer the
            # controller's pings late: 30 s set a node DOWN (and requeued its job) under load.
            # The tests that need a node down set it so themselves (set_node).
            "MinJobAge=600", "KillWait=2", "SlurmdTimeout=120", "InactiveLimit=0",
            "MessageTimeout=10", "SlurmdParameters=config_overrides",
            # A job in partition `urgent` (n2) cancels lower-tier jobs in its way (PREEMPTED).
            "PreemptType=preempt/partition_prio", "PreemptMode=CANCEL",
        ]
        keys = {line.split("=", 1)[0] for line in self.extra}
        lines = [line for line in lines if line.split("=", 1)[0] not in keys] + list(self.extra)
        gres = []
        for (name, (part, feature, gpu)), port in zip(self.nodes.items(), node_ports, strict=True):
            dev = self.root / "dev" / f"{gpu}-0"
            dev.touch()
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs=2 RealMemory=2000 Features={feature} Gres=gpu:{gpu}:1 "
                         "State=UNKNOWN")
            gres.append(f"NodeName={name} Name=gpu Type={gpu} File={dev}")
        first = next(iter(self.nodes))
        for name, (part, _, _) in self.nodes.items():
            lines.append(f"PartitionName={part} Nodes={name} MaxTime=INFINITE State=UP "
                         "PriorityTier=1" + (" Default=YES" if name == first else ""))
        if self.nodes is NODES:
            lines.append("PartitionName=urgent Nodes=n2 MaxTime=INFINITE State=UP "
                         "PriorityTier=10 PreemptMode=OFF")
            lines.append(f"PartitionName=duo Nodes={','.join(NODES)} MaxTime=INFINITE State=UP "
                         "PriorityTier=1")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")

    def start(self, timeout: float = 60.0, *, write: bool = True) -> None:
        if write:
            self.write_config()
        env = {**os.environ, **self.env}
        # -D: stay in the foreground, so the pid we hold is the daemon's (stopped by that pid).
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)], env)
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)], env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            for label, pid in self.pids.items():
                if _exited(pid):
                    raise RuntimeError(f"{label} exited at start; see {self.root}/*.log")
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle after {timeout:.0f} s: {states}")

    def _spawn(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.root / f"{label}.stdout", "wb")  # noqa: SIM115 - kept by the daemon
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.pids[label] = proc.pid

    def run(self, argv: list[str], *, check: bool = True) -> str:
        res = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, check=False,
                             text=True, timeout=30)
        if check and res.returncode:
            raise RuntimeError(f"{argv}: {res.stderr.strip()}")
        return res.stdout

    def set_node(self, node: str, state: str, reason: str = "test") -> None:
        """``scontrol update nodename=NODE state=STATE``. ``resume`` of a node that is up
        already (``ReturnToService=2`` brings a DOWN node back when its slurmd registers) is
        not an error."""
        argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
        if state.lower() in ("down", "drain"):
            argv.append(f"reason={reason}")
        res = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, check=False,
                             text=True, timeout=30)
        if res.returncode and not (state.lower() == "resume"
                                   and "Invalid node state" in res.stderr):
            raise RuntimeError(f"{argv}: {res.stderr.strip()}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM each daemon by pid (slurmd first), then SIGKILL what is left."""
        for label in sorted(self.pids, key=lambda k: k == "slurmctld"):
            _signal(self.pids[label], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(_exited(p) for p in self.pids.values()):
            time.sleep(0.2)
        for pid in self.pids.values():
            if not _exited(pid):
                _signal(pid, signal.SIGKILL)
                _exited(pid, wait=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exited(pid: int, wait: bool = False) -> bool:
    try:
        done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid
