"""Where trials can run: the Ray connection and each pool's Ray resources and capacity.

Embedded (no ``--address``/``RAY_ADDRESS``): ``ray.init()`` on this machine with each sim pool
as a custom resource ``pool:<name>`` of its capacity. On an existing cluster a pool maps to
``pool:<name>``, else ``accelerator_type:<X>`` (KubeRay worker groups advertise it), else the
``ray.io/accelerator-type`` node label; a pool nothing can host gets capacity 0 and a reason, and
its trials stay pending with it (never substituted, never a silent hang).

A SIGKILLed embedded orchestrator takes its GCS and raylet down with it (Ray fate-shares them
with the driver), but the raylet's children (dashboard agent, runtime-env agent, idle workers)
are re-parented and live on. ``connect`` reaps those of dead local sessions before it starts a
new one (``reap_stale_sessions``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from orchestrator.exceptions import UserError
from orchestrator.pools import PoolSpec
from orchestrator.store.workspace import scoped_environ

log = logging.getLogger(__name__)
LABEL_ACCELERATOR = "ray.io/accelerator-type"


# --------------------------------------------------------------------------- placement


@dataclasses.dataclass(frozen=True)
class Placement:
    """How trials of one pool are placed, and how many the cluster can run at once."""

    pool: str
    resources: Mapping[str, float]
    label_selector: Mapping[str, str] | None
    capacity: int
    reason: str | None = None  # why the pool cannot run anything here (capacity 0)
    enforced: bool = False  # Ray itself never runs more than `capacity` (one unit of the pool's resource each)


def plan_placement(pools: Mapping[str, PoolSpec], *, embedded: bool,
                   cluster_resources: Mapping[str, float],
                   node_labels: list[Mapping[str, str]], cpus: float = 1.0,
                   elsewhere: bool = False) -> dict[str, Placement]:
    """Map each pool to Ray resources; pools nothing can host get a capacity of 0 and a reason.
    ``elsewhere``: trials compute outside Ray (Slurm), so any pool is plain capacity here."""
    out: dict[str, Placement] = {}
    for name, pool in pools.items():
        res_key = pool.ray_resource
        base = {"CPU": cpus}
        if embedded and pool.kind == "gpu" and not elsewhere:
            out[name] = Placement(name, base, None, 0,
                                  f"pool {name} is a GPU pool; the embedded local Ray has no GPUs: "
                                  f"pass --address of a cluster that has it")
        elif res_key in cluster_resources or embedded:
            cap = int(cluster_resources.get(res_key, pool.capacity) + 1e-9)
            reason = None if cap > 0 else f"pool {name} has capacity 0 (Ray resource {res_key})"
            out[name] = Placement(name, {**base, res_key: 1.0}, None, cap, reason, enforced=True)
        elif pool.ray_accelerator_type and f"accelerator_type:{pool.ray_accelerator_type}" in cluster_resources:
            out[name] = Placement(name, {**base, f"accelerator_type:{pool.ray_accelerator_type}": 0.001},
                                  None, pool.capacity)
        elif pool.ray_accelerator_type and any(
                lab.get(LABEL_ACCELERATOR) == pool.ray_accelerator_type for lab in node_labels):
            out[name] = Placement(name, base, {LABEL_ACCELERATOR: pool.ray_accelerator_type},
                                  pool.capacity)
        else:
            acc = pool.ray_accelerator_type
            out[name] = Placement(name, base, None, 0,
                                  f"no node of the Ray cluster advertises {res_key}"
                                  + (f", accelerator_type:{acc} or label {LABEL_ACCELERATOR}={acc}"
                                     if acc else "") + "; add such nodes or pick another pool")
    return out


def resource_fn(placements: Mapping[str, Placement]) -> Any:
    from ray.tune import PlacementGroupFactory

    def resources(config: Mapping[str, Any]) -> Any:
        p = placements[config["pool"]]
        if p.label_selector:
            return PlacementGroupFactory([dict(p.resources)], bundle_label_selector=[dict(p.label_selector)])
        return PlacementGroupFactory([dict(p.resources)])

    return resources


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """An existing Ray cluster (``--address`` or ``$RAY_ADDRESS``) that accepts a connection
    within ``timeout_s``, checked before anything is written: ``ray.init`` would retry an
    unreachable one for minutes, deaf to SIGTERM. ``auto``/``local``: Ray's own discovery."""
    import socket

    addr = address or os.environ.get("RAY_ADDRESS")
    if not addr or addr in ("auto", "local"):
        return
    flag = "--address" if address else "$RAY_ADDRESS"
    hostport = addr.split("://", 1)[-1].split("/", 1)[0]
    if "@" in hostport:  # user:password@ is never printed
        hostport = hostport.rsplit("@", 1)[1]
        addr = addr.split("://", 1)[0] + "://***@" + hostport if "://" in addr else "***@" + hostport
    host, _, port = hostport.rpartition(":")
    fix = ("fix: start the cluster (`ray start --head`) or check the address; leave --address "
           "out (and unset $RAY_ADDRESS) to run on a local Ray started for this command")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {addr[:200]!r}: not HOST:PORT (or ray://HOST:PORT); {fix}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except TimeoutError:
        why = f"no answer within {timeout_s:g} s"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise UserError(f"{flag} {addr[:200]}: no Ray cluster answers at {host}:{port} ({why}); {fix}")


def connect(address: str | None, pools: Mapping[str, PoolSpec], ray_tmp: str | None,
            worker_env: Mapping[str, str | None] | None = None,
            elsewhere: bool = False) -> tuple[bool, bool]:
    """Connect to Ray: (we started an embedded local cluster, we own the connection).

    ``worker_env`` (the backend's ``worker_env``) reaches every worker: an embedded node starts
    its workers with this process's environment as it is during ``ray.init``; on an existing
    cluster it is the job's runtime environment (there a variable can be set, not unset). A
    caller that already initialised Ray (a notebook, a benchmark) keeps its connection and its
    workers' environment.
    """
    import ray

    env = dict(worker_env or {})
    addr = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return False, False
    if addr:
        values = {k: v for k, v in env.items() if v is not None}
        ray.init(address=addr, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": values} if values else None)
        return False, True
    capacity = {p.ray_resource: float(p.capacity) for p in pools.values()
                if p.kind in ("sim", "cpu") or elsewhere}
    temp_root = Path(ray_tmp) if ray_tmp else Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray"
    reaped = reap_stale_sessions(temp_root)
    if reaped:
        log.info("stopped %d Ray agent(s) left by a killed orchestrator: pids %s", len(reaped), reaped)
    with scoped_environ(env):
        _start_local(num_cpus=max(os.cpu_count() or 1, int(sum(capacity.values()))),
                     resources=capacity, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, _temp_dir=ray_tmp)
    return True, True


# Ray waits a fixed 30 s for a new local raylet to register with its GCS (the local
# ``raylet_start_wait_time_s`` in ray/_private/node.py, Node.__init__), then raises this; on a
# host whose cores are all busy (another job's trainer) registration can take longer.
_SLOW_START = "timed out during startup"


def _start_local(attempts: int = 3, **init: Any) -> None:
    """``ray.init(**init)`` for an embedded node, started again (up to ``attempts`` times) when
    Ray gave up waiting for its own raylet: the processes the failed start left are stopped
    first, so no second node shares the host with a half-started one."""
    import ray  # deferred, as in connect: `ablate status` imports this module

    me = psutil.Process()
    for attempt in range(1, attempts + 1):
        before = {p.pid for p in me.children(recursive=True)}
        try:
            ray.init(**init)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if _SLOW_START not in str(exc):
                raise
            left = [p for p in me.children(recursive=True) if p.pid not in before]
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(left, timeout=10)
            if attempt == attempts:
                raise UserError(
                    f"Ray: the local node did not start ({attempts} tries, each waiting Ray's "
                    "30 s for its raylet): this host is overloaded; fix: run again when it is "
                    "less busy, or start a cluster (`ray start --head`) and pass --address"
                ) from exc
            log.warning("Ray's local node did not register within Ray's 30 s (the host is "
                        "busy): starting it again (%d of %d)", attempt + 1, attempts)


_AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def reap_stale_sessions(temp_root: Path, grace_s: float = 3.0) -> list[int]:
    """SIGTERM the dashboard and runtime-env agents of dead local Ray sessions under
    ``temp_root`` (SIGKILL after ``grace_s``); returns their pids.

    An agent is stale when it is ours (same uid), writes its logs into a ``session_*`` directory
    under ``temp_root``, and its parent is no longer a raylet (the raylet died with a SIGKILLed
    driver and the agent was re-parented). Agents of live sessions, of other users and of
    clusters under another temp root are never touched. Linux only (``/proc``); a no-op elsewhere.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    prefix = str(temp_root.resolve()) + os.sep + "session_"
    reaped = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            if not (entry / "cmdline").read_bytes().startswith(_AGENTS):
                continue
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid > 1 and b"raylet" in (proc / str(ppid) / "cmdline").read_bytes():
                continue  # its session is alive
            if not any(os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir()):
                continue
            os.kill(int(entry.name), signal.SIGTERM)
            reaped.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to inspect
    deadline = time.monotonic() + grace_s
    while reaped and time.monotonic() < deadline and any(_alive(pid) for pid in reaped):
        time.sleep(0.1)
    for pid in reaped:  # the agents shut down slowly or not at all on SIGTERM
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return reaped


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def standby_slots(placements: Mapping[str, Placement], limits: Mapping[str, int],
             max_parallel: int) -> dict[str, int]:
    """One standby trial (``_gate.PoolGate``) for each pool that Ray itself keeps at its limit,
    when the grid limit cannot be reached by the pool limits anyway."""
    if sum(limits.values()) > max_parallel:
        return {}
    return {p: 1 for p, pl in placements.items() if pl.enforced and 0 < limits[p] == pl.capacity}
