"""A Miles grid's Kubernetes dry run: one RayJob per trial whose entrypoint is the trial's Miles
command (the entry point, then train.py's arguments), on the pool's Miles image, validated
against the official KubeRay schemas as the verl RayJobs are (``tests/k8s/k8svalidate.py``)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from orchestrator.backends import backend, on_launcher
from orchestrator.grid import expand, load_grid

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "k8s"))
from k8svalidate import load_all, validate  # the k8s tests' validator

GRID = REPO / "grids" / "miles_mis.yaml"


def test_miles_on_kubernetes_is_its_own_backend_with_the_same_trial_ids() -> None:
    assert on_launcher("miles", "k8s") == "k8s-miles" and on_launcher("verl", "k8s") == "k8s"
    assert backend("k8s-miles").identity() == backend("miles").identity()
    here, there = (expand(load_grid(GRID, backend=b)) for b in ("miles", "k8s-miles"))
    assert [t.trial_id for t in here] == [t.trial_id for t in there]


def test_the_dry_run_writes_a_rayjob_of_the_miles_command_per_trial(tmp_path, monkeypatch,
                                                                    capsys) -> None:
    pytest.importorskip("kubernetes")
    from orchestrator.cli import main

    monkeypatch.setenv("ABLATE_K8S_IMAGE", "radixark/miles:latest")
    out = tmp_path / "out"
    assert main(["submit", str(GRID), "--dry-run", "--out", str(out)]) in (0, None)
    files = sorted((out / "rayjobs").glob("ab-*.yaml"))
    grid = load_grid(GRID, backend="k8s-miles")
    trials = {t.trial_id: t for t in expand(grid)}
    assert len(files) == len(trials) == 36
    index = {e["file"]: e["trial_id"] for e in json.loads((out / "index.json").read_text())["trials"]}
    for f in files:
        (job,) = load_all(f.read_text())
        validate(job)
        argv = shlex.split(job["spec"]["entrypoint"])
        assert argv[:5] == ["python3", "-m", "orchestrator.miles.entry", "--checkout", "/root/miles"]
        trial = trials[index[f"rayjobs/{f.name}"]]
        mis = json.loads(argv[argv.index("--mis") + 1])
        assert mis is None or mis["tis_level"] == dict(trial.axes)["correction.is_level"]
        assert f"--num-rollout {trial.steps}" in shlex.join(argv)
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert head["containers"][0]["image"] == "radixark/miles:latest"
        env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and "TENSORBOARD_DIR" in env
    assert "wrote 36 RayJob manifest(s)" in capsys.readouterr().out
