"""Slurm accounting for the tests: a MariaDB server and ``slurmdbd`` under a temp directory,
and a one-node cluster that stores its jobs there and enforces associations and QOS
(``AccountingStorageEnforce=associations,qos``). Started and stopped by pid, like ``cluster``.

MariaDB listens on a free loopback port only (``--bind-address=127.0.0.1``, its own datadir,
socket and pid file, no binary log): nothing of the machine's own MariaDB is used or touched.
The account ``lab`` (with ``root`` in it) may use the QOS ``normal`` and ``fast``; ``MinJobAge``
is short so that a finished job soon leaves ``squeue``/``scontrol`` and only ``sacct`` knows it.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from cluster import Cluster, _exited, _signal

from orchestrator.slurm.raycluster import free_ports

NODE = {"a1": ("pacct", "fa", "h100")}
ACCOUNT, QOS = "lab", "fast"


def missing() -> str | None:
    """Why the accounting cluster cannot start here, or None."""
    for exe in ("mariadbd", "mariadb-install-db", "slurmdbd", "sacctmgr", "sacct"):
        if shutil.which(exe) is None:
            return (f"{exe} is not installed (apt-get install -y slurmdbd mariadb-server; "
                    ".ci/run does it as root)")
    return None


class Accounting:
    """MariaDB + slurmdbd + a one-node cluster (``self.cluster``) that uses them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db_port, self.dbd_port = free_ports(2, host="127.0.0.1")
        self.cluster = Cluster(root, name="ablate-acct", nodes=NODE, extra=(
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={self.dbd_port}",
            "AccountingStorageEnforce=associations,qos", "MinJobAge=2"))
        self.env = self.cluster.env
        self.pids: dict[str, int] = {}  # mariadbd, slurmdbd: stopped after the cluster

    def start(self, timeout: float = 60.0) -> None:
        self.cluster.write_config()  # slurmdbd.conf sits next to it; sacctmgr reads it
        data = self.root / "mysql"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
                                 f"--port={self.db_port}", "--bind-address=127.0.0.1",
                                 f"--socket={self.root}/mysql.sock",
                                 f"--pid-file={self.root}/mysql.pid", "--skip-log-bin",
                                 "--innodb-buffer-pool-size=32M",
                                 f"--log-error={self.root}/mysql.err"])
        self._wait_port(self.db_port, timeout, "mariadbd")
        conf = self.root / "slurmdbd.conf"
        conf.write_text("\n".join([
            "AuthType=auth/none", "DbdHost=localhost", "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}", "SlurmUser=root", f"PidFile={self.root}/slurmdbd.pid",
            f"LogFile={self.root}/slurmdbd.log", "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1", f"StoragePort={self.db_port}", "StorageUser=root",
            "StorageLoc=slurm_acct_db"]) + "\n")
        conf.chmod(0o600)  # slurmdbd refuses a readable config (it may hold a password)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait_port(self.dbd_port, timeout, "slurmdbd")
        for args in (["add", "cluster", self.cluster.name],
                     ["add", "qos", QOS],
                     ["add", "account", ACCOUNT, f"cluster={self.cluster.name}"],
                     ["add", "user", "root", f"account={ACCOUNT}", f"cluster={self.cluster.name}",
                      f"qos=normal,{QOS}"]):
            self.sacctmgr(*args)
        self.cluster.start(timeout, write=False)

    def sacctmgr(self, *args: str) -> str:
        return self.cluster.run(["sacctmgr", "-i", *args])

    def stop(self) -> None:
        self.cluster.stop()  # slurmctld last but before slurmdbd, which it reports to
        for label in ("slurmdbd", "mariadbd"):
            pid = self.pids.get(label)
            if pid is None:
                continue
            _signal(pid, 15)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not _exited(pid):
                time.sleep(0.2)
            if not _exited(pid):
                _signal(pid, 9)
                _exited(pid, wait=True)

    def _spawn(self, label: str, argv: list[str]) -> None:
        env = {**os.environ, **self.env}
        log = open(self.root / f"{label}.stdout", "wb")  # noqa: SIM115 - kept by the daemon
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.pids[label] = proc.pid

    def _wait_port(self, port: int, timeout: float, label: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _exited(self.pids[label]):
                raise RuntimeError(f"{label} exited at start; see {self.root}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"{label} did not listen on 127.0.0.1:{port} in {timeout:.0f} s")
