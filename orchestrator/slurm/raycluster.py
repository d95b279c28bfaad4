"""A Ray cluster across the nodes of one Slurm allocation: a multi-node verl trial's, and every
Miles trial's (its ``train.py`` is a Ray driver, ``miles.launch``).

The job's batch step runs on the allocation's first node. There :func:`cluster` starts the Ray
head (``ray start --head --block``, a child of this process) and, on every other node, a Ray
worker through ``srun --nodes=1 --ntasks=1 --nodelist=NODE`` running
``python -m orchestrator.slurm.raynode``, which picks ports free on its own node and runs
``ray start --address=HEAD --block``. It waits (bounded) until the cluster has one live Ray node
per Slurm node, each marked with a custom resource naming its Slurm node, and yields the head's
address (verl's ``ray_kwargs.ray_init.address``, Miles' ``RAY_ADDRESS``). Every command is an
argument list. On the way out each node records the pids of the Ray workers it ran
(``ray-node-NODE.json``).

Each Ray node gets its own temp dir and ports, so two Slurm nodes that are one machine (the test
cluster's multiple-slurmd mode) are two Ray nodes too. The processes get the environment the
driver gets: Ray workers inherit their raylet's environment, not the driver's.

Why not ``ray.util.spark``/``cluster_utils``: the first is Spark's, the second starts every node
from one process on one machine; here the nodes are the allocation's and ``srun`` reaches them.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from orchestrator.exceptions import InfraFailure

NODE_RESOURCE = "slurm_node_"  # + the Slurm node name: which Ray node is which Slurm node
JOIN_TIMEOUT_S = 180.0


def free_ports(n: int, host: str = "") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` (every interface by default) now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ray_exe() -> str:
    """The ``ray`` command of this Python (its console script sits next to it)."""
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else "ray"


def node_argv(*, temp_dir: str, node: str, num_cpus: int | None, num_gpus: int | None,
              head_port: int | None = None, address: str | None = None,
              node_ip: str | None = None, dashboard_port: int | None = None) -> list[str]:
    """``ray start ... --block`` for one node: the head (``head_port``) or a worker joining
    ``address``; every port it opens is one free here, so two nodes on one machine coexist
    (Ray's fixed defaults, such as the dashboard agent's 52365, would join them to the first
    cluster's agent). ``dashboard_port``: the head serves its dashboard and job server on
    loopback there."""
    gcs, mgr, obj, agent, grpc, env_agent, metrics, client = free_ports(8)
    argv = [ray_exe(), "start", "--block", "--disable-usage-stats", f"--temp-dir={temp_dir}",
            f"--node-manager-port={mgr}", f"--object-manager-port={obj}",
            f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
            f"--runtime-env-agent-port={env_agent}", f"--metrics-export-port={metrics}",
            f"--resources={json.dumps({NODE_RESOURCE + node: 1})}"]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    if address is None:
        argv += ["--head", f"--port={head_port or gcs}", f"--ray-client-server-port={client}"]
        argv += (["--include-dashboard=false"] if dashboard_port is None else
                 ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                  f"--dashboard-port={dashboard_port}"])
    else:
        argv.append(f"--address={address}")
    return argv


def allocation_nodes() -> list[str]:
    """The job's nodes, this (the batch) node first, from ``SLURM_JOB_NODELIST``."""
    listed = os.environ.get("SLURM_JOB_NODELIST", "")
    res = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True,
                         text=True, timeout=30, check=False)
    nodes = res.stdout.split()
    if res.returncode or not nodes:
        raise InfraFailure(f"infra_failure: scontrol show hostnames {listed!r} failed: "
                           f"{res.stderr.strip()}")
    me = os.environ.get("SLURMD_NODENAME", nodes[0])
    return [me] + [n for n in nodes if n != me]


def node_ip(node: str) -> str:
    """The address Slurm reaches ``node`` at (its ``NodeAddr``), as an IP."""
    res = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True,
                         text=True, timeout=30, check=False)
    addr = next((w.split("=", 1)[1] for w in res.stdout.split() if w.startswith("NodeAddr=")),
                node)
    try:
        return socket.gethostbyname(addr)
    except OSError as exc:
        raise InfraFailure(f"infra_failure: node {node}: its NodeAddr {addr!r} does not "
                           f"resolve ({exc})") from None


@contextlib.contextmanager
def cluster(env: Mapping[str, str], *, log_dir: Path, num_cpus: int | None,
            num_gpus: int | None, tag: str,
            timeout: float = JOIN_TIMEOUT_S) -> Iterator[tuple[str, list[str]]]:
    """Start Ray on every node of this allocation with ``env``; yield (head address, Slurm
    nodes) once all joined; stop every process it started (by pid) on the way out."""
    nodes = allocation_nodes()
    head_ip = node_ip(nodes[0])
    port = free_ports(1)[0]
    address = f"{head_ip}:{port}"
    head_tmp = f"/tmp/ablate-ray-{tag}-0"  # short: Ray's socket paths are limited
    log_dir.mkdir(parents=True, exist_ok=True)
    head: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        head = _start(node_argv(temp_dir=head_tmp, node=nodes[0], num_cpus=num_cpus,
                                num_gpus=num_gpus, head_port=port, node_ip=head_ip),
                      env, log_dir / f"ray-{nodes[0]}.log")
        _wait_port(head_ip, port, head, timeout)
        for i, node in enumerate(nodes[1:], start=1):
            argv = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
                    "--kill-on-bad-exit=0", sys.executable, "-m", "orchestrator.slurm.raynode",
                    f"--address={address}", f"--node={node}", f"--log-dir={log_dir}",
                    f"--temp-dir=/tmp/ablate-ray-{tag}-{i}"]
            argv += [f"--num-cpus={num_cpus}"] if num_cpus is not None else []
            argv += [f"--num-gpus={num_gpus}"] if num_gpus is not None else []
            workers.append(_start(argv, env, log_dir / f"ray-{node}.log"))
        _wait_joined(address, nodes, [head, *workers], timeout, env)
        yield address, nodes
    finally:
        # srun forwards SIGUSR1 to raynode, which stops its node and cleans up; SIGTERM to
        # srun would make Slurm kill the step KillWait later, cutting that short.
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
        for proc in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            stop_process(proc)
        if head is not None:
            record_node(log_dir, nodes[0], head_tmp)
            stop_process(head)
        remove_temp(head_tmp)


def record_node(log_dir: Path, node: str, temp_dir: str) -> None:
    """``ray-node-NODE.json``: the pids of the Ray worker processes this Ray node ran (from
    their log files' names, ``python-core-worker-<id>_<pid>.log``)."""
    pids = sorted(int(p.stem.rsplit("_", 1)[1]) for p in
                  Path(temp_dir).glob("session_*/logs/python-core-worker-*_*.log"))
    (log_dir / f"ray-node-{node}.json").write_text(json.dumps({"node": node, "worker_pids": pids}))


def remove_temp(temp_dir: str, tries: int = 20) -> None:
    """Remove a Ray node's temp dir. Its raylet may outlive ``ray start`` by a moment and
    write there while the first removal runs, so it is retried (bounded) until gone."""
    for _ in range(tries):
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not os.path.exists(temp_dir):
            return
        time.sleep(0.5)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM (``ray start --block`` then stops its node's processes), SIGKILL after
    ``grace``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _start(argv: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _wait_port(host: str, port: int, head: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise InfraFailure(f"infra_failure: the Ray head exited with {head.returncode} "
                               "before it listened")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
            return
        time.sleep(0.5)
    raise InfraFailure(f"infra_failure: the Ray head did not listen on {host}:{port} in "
                       f"{timeout:.0f} s")


def _wait_joined(address: str, nodes: list[str], procs: list[subprocess.Popen[bytes]],
                 timeout: float, env: Mapping[str, str]) -> None:
    """Until every Slurm node has a live Ray node (asked in a subprocess: this process stays
    no Ray driver)."""
    code = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', "
            "log_to_driver=False); print(json.dumps([sorted(n['Resources']) for n in "
            "ray.nodes() if n['Alive']]))")
    deadline = time.monotonic() + timeout
    joined: set[str] = set()
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise InfraFailure(f"infra_failure: a Ray node process ({proc.args[0]} ...) "
                                   f"exited with {proc.returncode} before the cluster formed")
        try:
            res = subprocess.run([sys.executable, "-c", code, address], capture_output=True,
                                 text=True, timeout=60, env=dict(env), check=False)
        except subprocess.TimeoutExpired:
            continue
        if res.returncode == 0 and res.stdout.strip():
            names = [r for node in json.loads(res.stdout.strip().splitlines()[-1]) for r in node]
            joined = {r.removeprefix(NODE_RESOURCE) for r in names if r.startswith(NODE_RESOURCE)}
            if joined >= set(nodes):
                return
        time.sleep(1.0)
    raise InfraFailure(f"infra_failure: {len(joined)} of {len(nodes)} Ray nodes joined in "
                       f"{timeout:.0f} s (missing: {', '.join(sorted(set(nodes) - joined))})")
