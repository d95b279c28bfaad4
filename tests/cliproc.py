"""``ablate`` as a user runs it, for tests: a subprocess with its own workdir, Ray temp dir and
(piped, so not a terminal) stdout, on the embedded local Ray.

``double=True`` runs the same command line with backend ``sim`` resolved to the deterministic
double of ``tests/doubles.py`` (its Ray workers import it from ``tests/`` on PYTHONPATH), for
what the real simulator cannot be made to do on demand: fail, retry, collapse in a second.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

_DOUBLE_MAIN = (
    "import sys; from orchestrator import backends; "
    "backends._TRAINERS['sim'] = ('doubles', 'DoubleTrainer'); "
    "from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"
)


@contextmanager
def ablate_env(root: Path, extra: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """The environment of ``ablate`` run in ``root``: workdir ``root/.ablate``, the repo's
    recipes, a short private Ray temp dir (removed afterwards), no tracking URI, Ray address or
    MLflow run inherited from the test session."""
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    path = os.pathsep.join(filter(None, [str(REPO), str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "ABLATE_WORKDIR": str(root / ".ablate"),
           "ABLATE_RECIPES": str(REPO / "recipes"), "RAY_TMPDIR": ray_tmp, "PYTHONPATH": path,
           "COLUMNS": "200", **(extra or {})}
    for key in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"):
        env.pop(key, None)
    try:
        yield env
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def command(args: Sequence[str], *, double: bool = False) -> list[str]:
    head = [sys.executable, "-c", _DOUBLE_MAIN] if double else [sys.executable, "-m", "orchestrator"]
    return [*head, *args]


def run(args: Sequence[str], env: Mapping[str, str], cwd: Path, *, double: bool = False,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``ablate args`` to its end; stdout and stderr captured (pipes, not a terminal)."""
    return subprocess.run(command(args, double=double), env=dict(env), cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, check=False)


def start(args: Sequence[str], env: Mapping[str, str], cwd: Path, *, double: bool = False,
          log: Path | None = None) -> subprocess.Popen[str]:
    """Start ``ablate args`` in its own process group (``stop`` ends it); its stdout and stderr
    go to ``log`` (default ``cwd/ablate.log``), which nobody has to drain while it runs."""
    with open(log or cwd / "ablate.log", "w") as out:
        return subprocess.Popen(command(args, double=double), env=dict(env), cwd=cwd, text=True,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_piped(args: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
    """Start ``ablate args`` in its own session with this environment (no tracking URI) and its
    stdout piped, for a test that reads what it prints first (``ablate ui``'s URL)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen(command(args), stdout=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=cwd, env=env)


def stop(proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Interrupt a started command's process group (as Ctrl-C does) and wait for it."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
