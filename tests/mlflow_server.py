"""A real ``mlflow server`` on 127.0.0.1 for tests: start, stop (outage), restart on the same port.

The server runs in its own session so stopping it ends its gunicorn workers too (by its process
group id, which this helper created). Waits are bounded.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from orchestrator.tracking._ui import server_command, server_env

START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(port: int) -> bool:
    """Whether an MLflow server (``mlflow server`` or ``ablate ui``'s) answers on ``port``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def wait_healthy(port: int, timeout: float = START_TIMEOUT_S) -> bool:
    """Whether the server on ``port`` answers within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not healthy(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


class MlflowServer:
    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        cmd = server_command(f"sqlite:///{self.root / 'server.db'}", self.port, self.root / "artifacts")
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - owned by the process
        env = {**server_env(), "MLFLOW_TRACKING_URI": ""}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                     start_new_session=True, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"mlflow server not ready on {self.uri} after {START_TIMEOUT_S} s")

    def healthy(self) -> bool:
        return healthy(self.port)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGINT is gunicorn's quick shutdown (SIGTERM waits up to 30 s for workers).
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        try:  # workers of the group this helper created must not outlive it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None
        deadline = time.monotonic() + 20
        while self.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)
