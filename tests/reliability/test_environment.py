"""A bad environment is one line, exit code 2, before anything starts: a workdir that is a
regular file (or lies under one) or is read-only, for every command; a tracking URI that is
malformed, a ``file:`` store in a read-only place, a ``sqlite:`` path that cannot be opened.
No Ray: each is refused before Ray would start (the grid's directory is never created)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import relhelpers as H


@pytest.fixture
def grid_file(isolated: Path) -> str:
    return str(H.one_trial_grid(isolated / "g.yaml", "envgrid", steps=4))


def _commands(grid: str) -> list[list[str]]:
    return [["submit", grid], ["status"], ["status", "envgrid"], ["cancel", "envgrid"],
            ["compare", grid], ["resume", grid, "--failed", "--pool", "sim-h100"], ["ui"],
            ["run-trial", grid, "--trial", "t000000000000"]]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    return H.refused_in_one_line(capsys, argv, within=10)  # before anything slow starts


@pytest.mark.parametrize("under", [False, True], ids=["file", "under-a-file"])
def test_a_workdir_that_is_a_regular_file_is_refused_by_every_command(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str], under: bool
) -> None:
    blocker = isolated / "wd"
    blocker.write_text("not a directory")
    workdir = blocker / "sub" if under else blocker
    for argv in _commands(grid_file):
        err = _one_line(capsys, [*argv, "--workdir", str(workdir)])
        assert err.startswith(f"error: workdir {workdir}: "), (argv, err)
        assert "is not a directory" in err and f"move {blocker} away" in err, err
    assert blocker.read_text() == "not a directory"


@pytest.fixture
def read_only(isolated: Path) -> Iterator[Path]:
    where = isolated / "ro"
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(where)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root and mount(8)): {exc}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


def test_a_read_only_workdir_is_refused_by_every_command_that_writes(
    grid_file: str, read_only: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in _commands(grid_file):
        if argv[0] == "status":
            continue  # reads only
        err = _one_line(capsys, [*argv, "--workdir", str(read_only)])
        assert err.startswith(f"error: workdir {read_only}: {read_only} is not writable "
                              "(Read-only file system); fix: pass --workdir DIR"), (argv, err)
    # status reads a read-only workdir: nothing ran there yet, which it says
    err = _one_line(capsys, ["status", "--workdir", str(read_only)])
    assert err.startswith(f"error: no grids have run in {read_only}")


BAD_URIS = {
    "no-scheme": ("not a uri", "unknown scheme (none)"),
    "unknown-scheme": ("htp://localhost:5000", "unknown scheme htp:"),
    "no-host": ("http://", "no host in the server URL"),
    "bad-port": ("http://localhost:50x0", "the port is not a number"),
    "two-slash-sqlite": ("sqlite://mlflow.db", "a SQLite URI has three slashes before the path"),
    "no-sqlite-file": ("sqlite:///", "no database file"),
}


@pytest.mark.parametrize(("uri", "said"), BAD_URIS.values(), ids=BAD_URIS.keys())
@pytest.mark.parametrize("command", ["submit", "compare", "resume", "run-trial", "ui"])
def test_a_malformed_tracking_uri_is_refused_before_anything_starts(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str], uri: str, said: str,
    command: str
) -> None:
    argv = next(a for a in _commands(grid_file) if a[0] == command)
    err = _one_line(capsys, [*argv, "--tracking-uri", uri])
    assert err.startswith(f"error: tracking URI {uri!r}: {said}; fix: "), err
    assert not (isolated / ".ablate" / "envgrid").exists()


def test_stores_that_cannot_be_opened_are_refused(
    isolated: Path, grid_file: str, read_only: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = isolated / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    blocker = isolated / "afile"
    blocker.write_text("x")
    cases = {
        f"sqlite:///{garbage}": f"{garbage} cannot be opened as a SQLite database (file is not a database)",
        f"sqlite:///{isolated}": f"{isolated} is a directory, not a database file",
        f"sqlite:///{blocker}/sub/mlflow.db": f"cannot create {blocker}/sub/mlflow.db: {blocker} is not a directory",
        f"sqlite:///{read_only}/mlflow.db": f"cannot create {read_only}/mlflow.db: {read_only} is not writable (Read-only file system)",
        # MLflow 3 refuses file stores deep inside, after Ray started: refused first, with a fix that works
        f"file://{read_only}/mlruns": "MLflow 3 no longer runs file stores (a directory of runs)",
        f"file://{isolated}/mlruns": "MLflow 3 no longer runs file stores (a directory of runs)",
    }
    for uri, said in cases.items():
        err = _one_line(capsys, ["submit", grid_file, "--tracking-uri", uri])
        assert err.startswith(f"error: tracking URI {uri!r}: {said}; fix: "), err
    # $MLFLOW_TRACKING_URI is the same store by another road
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{garbage}")
    err = _one_line(capsys, ["submit", grid_file])
    assert "cannot be opened as a SQLite database" in err
    assert not (isolated / ".ablate" / "envgrid").exists()
    assert garbage.read_bytes() == b"this is not a database" * 100
