"""``ablate ui``: the MLflow UI on loopback for a grid's store, opened on a view that shows the
trial runs' axis values and verdicts as columns (MLflow's default shows no params at all).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.exceptions import UserError
from orchestrator.grid import load_yaml
from orchestrator.store import workspace
from orchestrator.tracking._store import client, is_remote
from orchestrator.tracking._views import save_trials_view


def ui(grid: str | None = None, port: int = 5000, tracking_uri: str | None = None,
       workdir: str | None = None) -> int:
    """Serve the MLflow UI on 127.0.0.1 for the grid's store until interrupted; prints the URL."""
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
    cmd = server_command(uri, port, workspace.artifact_root(workdir))
    print(f"MLflow UI for {uri}: http://127.0.0.1:{port}/{suffix}  (Ctrl-C to stop)", flush=True)
    proc = subprocess.Popen(cmd, env=server_env())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached the server too; SIGINT is gunicorn's quick shutdown.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        return 0


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
