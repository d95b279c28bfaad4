"""A disk that fills up during ``ablate submit``: one line (where, what is free, about how much
the grid still needs, the fix), exit code 2, no trial retried onto the full disk, the attempt
recorded as an infra failure; after space is freed the same submit finishes every trial exactly
once. Once with ENOSPC injected at the write of a metrics line, once on a real small tmpfs.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import relhelpers as H

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.scheduler._faults import tree_size

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("double")]


def _disk_full_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_enospc_at_a_metrics_write_stops_cleanly_and_the_next_submit_resumes(
    isolated: Path, cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator import backends

    c, _nodes = cluster
    monkeypatch.setitem(backends._TRAINERS, "sim", ("relbackends", "MetricsDiskFullTrainer"))
    path = H.write_grid(isolated / "g.yaml", "enospc", steps=20, seeds=[0], levels=["token"],
                        pools=["sim-h100"], tiny=False)
    grid_dir = isolated / ".ablate" / "enospc"
    capsys.readouterr()
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 2
    line = _disk_full_line(capsys.readouterr().err)
    assert line.startswith(f"error: disk full under {isolated / '.ablate'} (OSError: ")
    assert "No space left on device" in line and " free there; " in line
    assert "fix: free space (or pass --workdir on a larger disk)" in line
    (t,) = H.trials(grid_dir).values()
    # Not retried onto the full disk: one attempt, recorded as an infra failure at the write.
    (a,) = t["attempts"]
    assert (a.outcome, a.end_step) == ("infra_failure", 9) and "No space left on device" in a.reason
    assert t["state"].state.value == "pending" and t["steps"] == list(range(1, 10))
    assert main(["submit", str(path), "--address", c.address, "--no-progress"]) == 0
    uri = f"sqlite:///{isolated / '.ablate' / 'mlflow.db'}"
    H.check_exactly_once(grid_dir, uri, steps=20, keys=("critic/score/mean", "acc"))
    (t,) = H.trials(grid_dir).values()
    assert [(x.outcome, x.resumed_from_step) for x in t["attempts"]] == [
        ("infra_failure", None), ("completed", 5)]


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount(8)): {exc}")


def test_a_real_full_tmpfs_stops_the_submit_and_freeing_space_finishes_the_grid(
    isolated: Path, cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c, _nodes = cluster
    small = isolated / "small"
    _mount_tmpfs(small, "8m")
    try:
        path = H.write_grid(isolated / "g.yaml", "tmpfs", steps=40, seeds=[0, 1], levels=["token"],
                            pools=["sim-h100", "sim-a100"], tiny=False)
        workdir = small / "wd"
        uri = f"sqlite:///{isolated / 'mlflow.db'}"  # the store elsewhere: the workdir fills
        args = ["submit", str(path), "--address", c.address, "--no-progress",
                "--workdir", str(workdir), "--tracking-uri", uri]
        # Leave about 200 KB: the grid's records fit, its trials' steps and checkpoints do not.
        ballast = small / "ballast"
        free = os.statvfs(small).f_bavail * os.statvfs(small).f_frsize
        ballast.write_bytes(b"\0" * (free - 200 * 1024))
        capsys.readouterr()
        assert main(args) == 2
        line = _disk_full_line(capsys.readouterr().err)
        assert line.startswith(f"error: disk full under {workdir}") and "fix: free space" in line
        assert "No space left on device" in line
        # how much more: measured from the trials' own files, more than the ~200 KB it had
        need = re.search(r"unfinished trials need about ([0-9.]+) (KB|MB) more", line)
        assert need is not None, line
        need_bytes = float(need[1]) * (1024 if need[2] == "KB" else 1024 * 1024)
        grid_dir = workdir / "tmpfs"
        at_stop = tree_size(grid_dir / "trials")
        ballast.unlink()  # free the space; the same command finishes the grid
        for _ in range(3):
            rc = main(args)
            if rc == 0:
                break
        assert rc == 0, capsys.readouterr().err
        # The estimate is of the right size: what the trials' files grew by until they finished.
        grown = tree_size(grid_dir / "trials") - at_stop
        (isolated / "diskfull.txt").write_text(f"{line}\nestimated {need_bytes:.0f} grown {grown}\n")
        assert grown / 2 <= need_bytes <= grown * 2, (need_bytes, grown, line)
        counts = H.check_exactly_once(grid_dir, uri, steps=40, keys=("critic/score/mean", "acc"))
        assert counts["trials"] == len(expand(load_grid(path)))
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False, capture_output=True, timeout=30)
