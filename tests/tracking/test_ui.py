"""``ablate ui``: a port another server holds is refused (or, without ``--port``, a free one is
used and said); SIGTERM or SIGINT to ``ablate ui`` takes the MLflow server's whole process group
(``mlflow server``, gunicorn's master and workers) down, and the port is free again."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import cliproc
import pytest
from mlflow_server import free_port, wait_healthy

from orchestrator.cli import main
from orchestrator.exceptions import UserError
from orchestrator.tracking import _ui
from orchestrator.tracking._ui import pick_port, port_free

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_busy_port_is_refused_in_one_line(
    isolated: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    work = isolated / ".ablate"
    work.mkdir()
    (work / "mlflow.db").touch()  # an (empty) store: the port is checked before the server starts
    capsys.readouterr()
    assert main(["ui", "--port", str(busy_port)]) == 2
    out, err = capsys.readouterr()
    assert err == (f"error: --port {busy_port}: 127.0.0.1:{busy_port} is already in use by another "
                   "server; fix: stop it, or pass another --port (or none, to get a free one)\n")
    assert "http://" not in out  # no URL of somebody else's server


def test_without_a_port_a_taken_default_is_replaced_by_a_free_one_and_said(
    busy_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_ui, "DEFAULT_PORT", busy_port)
    port = pick_port(None)
    assert port != busy_port and port_free(port)
    assert capsys.readouterr().out == f"port {busy_port} is in use; serving on port {port} instead\n"
    with pytest.raises(UserError, match="not a TCP port"):
        pick_port(70000)


def _group(pgid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    out.add(int(d.name))
            except ProcessLookupError:
                continue
    return out


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_ablate_ui_takes_the_whole_server_group_down(tmp_path: Path, sig: int) -> None:
    work = tmp_path / ".ablate"
    work.mkdir()
    from orchestrator.tracking import client

    client(f"sqlite:///{work / 'mlflow.db'}").search_experiments()  # creates the store
    port = free_port()
    proc = cliproc.start_piped(["ui", "--port", str(port), "--workdir", str(work)], REPO)
    server = None
    try:
        assert f"http://127.0.0.1:{port}/" in proc.stdout.readline()  # type: ignore[union-attr]
        assert wait_healthy(port)
        (server,) = _children(proc.pid)
        group = _group(os.getpgid(server))
        assert os.getpgid(server) != os.getpgid(proc.pid)  # the server has a group of its own
        assert len(group) >= 3, group  # mlflow server, gunicorn master, its workers
        os.kill(proc.pid, sig)  # to `ablate ui` alone, as a service manager or `kill` sends it
        assert proc.wait(timeout=60) == 0
        assert not {p for p in group if _alive(p)}  # nobody of the group is left
        assert port_free(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server, signal.SIGKILL)  # only if the test failed


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
