"""Pinned CPU numerics: every simulator process starts pinned, every trial records the numeric
environment it really ran under (attempt record + MLflow tags), an opt-out is recorded as one,
and ``ablate compare`` warns when the trials it compares ran under different environments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cliproc
import pytest
from rayclusters import write_grid
from trialrecords import trials as read_trials

from orchestrator import scheduler
from orchestrator.compare import compare
from orchestrator.run import run_single
from orchestrator.sim import numerics
from orchestrator.tracking import client

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "sim" / "golden" / "runs.json"


def _grid(path: Path, name: str, extra_overrides: str = "", axes: str = "") -> Path:
    return write_grid(path, name, steps=3, seeds=[0], levels=["none", "token"], pools=["sim-h100"],
                      axes=axes, every=3, keep=1, retries=None, budget=None, extra=extra_overrides)


def _env_of(trial: dict) -> dict[str, str]:
    return trial["attempts"][-1].environment or {}


@pytest.mark.skipif(numerics.pinnable() is not None, reason="this machine cannot be pinned")
def test_workers_start_pinned_and_record_it_and_compare_warns_on_mixed_environments(
        isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # The driver itself unpinned: the embedded Ray node must get the pins from the backend.
    for key in numerics.PINNED:
        monkeypatch.delenv(key, raising=False)
    path = _grid(isolated / "g.yaml", "pinned")
    summary = scheduler.submit(str(path), progress=False)
    assert summary["states"] == {"done": 2}
    trials = read_trials(Path(summary["grid_dir"]))
    golden_fp = json.loads(GOLDEN.read_text())["environment"]["numerics.fingerprint"]
    mlc = client(summary["tracking_uri"])
    for t in trials.values():
        env = _env_of(t)
        assert env["numerics.reproducible"] == "true", env
        assert env["numerics.aten_capability"] == "AVX2"
        assert env["numerics.levels"] == ",".join(f"{k}={v}" for k, v in numerics.PINNED.items())
        # Same pinned environment as the golden runs (same torch/MKL/oneDNN): same arithmetic.
        assert env["numerics.fingerprint"] == golden_fp
        tags = mlc.get_run(t["state"].mlflow_run_id).data.tags
        assert tags["numerics.fingerprint"] == golden_fp and tags["numerics.reproducible"] == "true"
    out = compare(str(path), out_dir=isolated / "res")
    text = (out / "summary.md").read_text()
    assert "Numeric environment (2 trials): pinned AVX2" in text and "Warning" not in text
    # One trial's run now says it ran elsewhere, unpinned: compare must say so.
    other = next(iter(trials.values()))["state"].mlflow_run_id
    mlc.set_tag(other, "numerics.fingerprint", "0123456789")
    mlc.set_tag(other, "numerics.reproducible", "false")
    mlc.set_tag(other, "numerics.why", "sim.reproducible: false (opted out)")
    capsys.readouterr()
    out = compare(str(path), out_dir=isolated / "res")
    text = (out / "summary.md").read_text()
    assert "the trials ran under 2 different numeric environments" in text
    assert "`0123456789` (1 trials): unpinned (sim.reproducible: false (opted out))" in text
    assert "2 different numeric environments" in capsys.readouterr().out
    assert "different numeric environments" in (out / "summary.html").read_text()


def test_an_opt_out_is_recorded_as_one(isolated: Path) -> None:
    path = _grid(isolated / "g.yaml", "optout", "  sim.reproducible: false\n")
    plan = cliproc.run(["plan", str(path), "--json"], os.environ, isolated)
    assert plan.returncode == 0, plan.stderr
    trial_id = next(iter(json.loads(plan.stdout)["trials"]))["trial_id"]
    run_single(str(path), trial_id)
    (t,) = [t for tid, t in read_trials(isolated / ".ablate" / "optout").items() if tid == trial_id]
    env = _env_of(t)
    assert env["numerics.reproducible"] == "false"
    assert env["numerics.why"] == "sim.reproducible: false (opted out)"


def test_sim_reproducible_cannot_vary_between_trials(isolated: Path) -> None:
    path = _grid(isolated / "g.yaml", "vary", axes="  sim.reproducible: [true, false]\n")
    res = cliproc.run(["plan", str(path)], os.environ, isolated)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "sim.reproducible cannot vary between trials" in res.stderr
    assert "set it once under 'overrides:'" in res.stderr


def _run_python(code: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                          text=True, cwd=REPO).stdout.strip()


@pytest.mark.skipif(numerics.pinnable() is not None, reason="this machine cannot be pinned")
def test_an_unpinned_process_says_why_and_ensure_pinned_reexecutes_it() -> None:
    bare = {k: v for k, v in os.environ.items() if k not in numerics.PINNED}
    described = _run_python(
        "import torch, json; from orchestrator.sim import numerics; "
        "print(json.dumps(numerics.describe(True)))", bare)
    env = json.loads(described)
    assert env["reproducible"] is False
    assert "did not start with the pinned numeric variables" in env["why"]
    # A command-line entry point that imported torch first is run again, pinned.
    code = ("import torch, sys; from orchestrator.sim import numerics; numerics.ensure_pinned(); "
            "print(torch.backends.cpu.get_cpu_capability(), numerics.describe(True)['reproducible'])")
    assert _run_python(code, bare) == "AVX2 True"
