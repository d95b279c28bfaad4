"""A refused ``ablate resume`` loses nothing (issue #24): the finished trial keeps its state,
verdict, attempts and metrics byte for byte, whether the resume is refused by its checks (the
tracking server or the Ray cluster does not answer: real closed ports on 127.0.0.1) or its run
never starts the trial's attempt (the target pool has no node in a real Ray cluster)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.scheduler import resume
from orchestrator.store import TrialPaths, records, workspace

GRID = """\
name: keep
recipe: sim/grpo_tiny
backend: sim
steps: 4
seeds: [0]
axes:
  pool: [sim-h100]
checkpoint: {every: 2}
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  eval.every: 100
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
"""


@pytest.fixture
def finished(isolated: Path) -> tuple[str, str, Path]:
    """A grid whose one trial ran to its verdict (in this process, real simulator)."""
    path = isolated / "keep.yaml"
    path.write_text(GRID)
    (t,) = expand(load_grid(path))
    assert run_single(str(path), t.trial_id)["state"] == "done"
    return str(path), t.trial_id, TrialPaths(workspace.grid_dir("keep"), t.trial_id).root


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def _kept(root: Path, tid: str, before: dict[str, bytes]) -> None:
    assert _files(root) == before
    rec = records.load_state(TrialPaths(root.parent.parent, tid), tid)
    assert rec.state.value == "done" and rec.verdict and rec.verdict["kind"] == "healthy"
    assert rec.resume is None


def test_resume_refused_by_its_checks_changes_nothing(
    finished: tuple[str, str, Path], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    path, tid, root = finished
    before = _files(root)
    argv = ["resume", path, "--trial", tid, "--pool", "sim-h100", "--from", "2"]
    for extra, env, said in [
        ([], {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, "no MLflow server answers at 127.0.0.1:9"),
        (["--tracking-uri", "http://127.0.0.1:9"], {}, "no MLflow server answers"),
        (["--address", "127.0.0.1:1"], {}, "--address 127.0.0.1:1: no Ray cluster answers"),
        ([], {"RAY_ADDRESS": "127.0.0.1:1"}, "$RAY_ADDRESS 127.0.0.1:1: no Ray cluster answers"),
    ]:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            capsys.readouterr()
            t0 = time.monotonic()
            assert main([*argv, *extra]) == 2
            err = capsys.readouterr().err
            assert time.monotonic() - t0 < 15
            assert err.count("\n") == 1 and said in err and "Traceback" not in err, err
        _kept(root, tid, before)


@pytest.mark.slow
def test_a_resume_whose_attempt_never_starts_puts_the_record_back(
    finished: tuple[str, str, Path], cluster: tuple[object, dict[str, str]],
    capsys: pytest.CaptureFixture[str]
) -> None:
    """The cluster has nodes for sim-h100 and sim-a100 only: a resume on sim-h20 passes every
    check, writes its request, and the trial is parked without an attempt. It must come back
    as it was (it was left pending, its verdict gone), and the command say so with exit 2."""
    path, tid, root = finished
    before = _files(root)
    c, _nodes = cluster
    out = resume(path, trial_ids=[tid], pool="sim-h20", start=2, address=c.address,  # type: ignore[attr-defined]
                 progress=False)
    assert out["resumed"] == [] and "sim-h20" in out["not_resumed"][tid], out["not_resumed"]
    _kept(root, tid, before)
    capsys.readouterr()
    assert main(["resume", path, "--trial", tid, "--pool", "sim-h20", "--from", "2",
                 "--address", c.address]) == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert f"error: trial {tid} not resumed (" in err and "verdict kept" in err, err
    _kept(root, tid, before)
