"""``ablate ui``: the MLflow UI on loopback for a grid's store, opened on a view that shows the
trial runs' axis values and verdicts as columns (MLflow's default shows no params at all).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.exceptions import UserError
from orchestrator.grid import load_yaml
from orchestrator.store import workspace
from orchestrator.tracking._store import client, is_remote
from orchestrator.tracking._views import save_trials_view

DEFAULT_PORT = 5000


def ui(grid: str | None = None, port: int | None = None, tracking_uri: str | None = None,
       workdir: str | None = None) -> int:
    """Serve the MLflow UI on 127.0.0.1 for the grid's store until interrupted; prints the URL.

    A ``port`` that is taken is refused (it would print the URL of somebody else's server);
    without one, 5000 or else a free port is used, and said. The server (``mlflow server``
    and its gunicorn workers) runs in its own process group, which SIGINT or SIGTERM to this
    process takes down whole."""
    uri = workspace.tracking_uri(tracking_uri, workdir)
    name = _grid_name(grid) if grid else None
    suffix = ""
    if is_remote(uri):
        if name:
            exp = client(uri).get_experiment_by_name(name)
            suffix = f"#/experiments/{exp.experiment_id}/runs" if exp else ""
        print(f"MLflow server already at {uri.rstrip('/')}/{suffix}")
        return 0
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise UserError(f"no MLflow store at {uri}; fix: run `ablate submit` first or pass --tracking-uri")
    if name:
        mlc = client(uri)
        exp = mlc.get_experiment_by_name(name)
        if exp is None:
            raise UserError(f"grid {name!r} has no MLflow experiment in {uri}; fix: submit it first")
        suffix = f"#/experiments/{exp.experiment_id}/runs?viewStateShareKey={save_trials_view(mlc, exp.experiment_id)}"
    port = pick_port(port)
    cmd = server_command(uri, port, workspace.artifact_root(workdir))
    print(f"MLflow UI for {uri}: http://127.0.0.1:{port}/{suffix}  (Ctrl-C to stop)", flush=True)
    proc = subprocess.Popen(cmd, env=server_env(), start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_group(proc)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends `ablate ui` the way Ctrl-C does


def port_free(port: int) -> bool:
    """Nobody listens on 127.0.0.1:``port`` (and we may bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(port: int | None) -> int:
    """``port`` if free (``UserError`` if taken); without one, 5000 or a free port (said)."""
    if port is not None:
        if not 1 <= port <= 65535:
            raise UserError(f"--port {port}: not a TCP port; allowed: 1-65535")
        if not port_free(port):
            raise UserError(f"--port {port}: 127.0.0.1:{port} is already in use by another "
                            f"server; fix: stop it, or pass another --port (or none, to get a "
                            f"free one)")
        return port
    if port_free(DEFAULT_PORT):
        return DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        free = int(sock.getsockname()[1])
    print(f"port {DEFAULT_PORT} is in use; serving on port {free} instead", flush=True)
    return free


def stop_group(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Take down the server's whole process group (gunicorn's master and workers): SIGINT,
    gunicorn's quick shutdown, then SIGKILL for whatever is left after ``timeout``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # the leader is gone; its workers may not be
    for sig, wait in ((signal.SIGINT, timeout), (signal.SIGKILL, timeout)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                return
            time.sleep(0.1)
    proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def server_env() -> dict[str, str]:
    """The server's environment: MLflow's GenAI job runner off (it starts ~7 huey worker
    processes that runs of this tool never use; on a laptop they only take CPU and memory)."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def server_command(backend_uri: str, port: int, artifacts: Path, workers: int = 2) -> list[str]:
    """``mlflow server`` on loopback; gunicorn workers, since uvicorn stalls ~40 ms per reused
    connection on this MLflow (research/ray-and-mlflow-baselines.md)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
            "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--gunicorn-opts", "--timeout=120"]


def _grid_name(grid: str) -> str:
    """A grid file's ``name:`` (read without the full validation) or the name itself."""
    path = Path(grid)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise UserError(f"{grid}: no such grid file; fix: pass a grid file or a grid name")
        data = load_yaml(path)
        data = data[0] if isinstance(data, tuple) else data
        if not isinstance(data, dict) or "name" not in data:
            raise UserError(f"{grid}: the grid file has no `name:`; fix: add one")
        return str(data["name"])
    return grid
