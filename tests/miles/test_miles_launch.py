"""A Miles trial launched for real as a Ray job, watched, its metrics and checkpoints followed.

Miles itself cannot run here (SGLang and Megatron need GPUs), so the pool's Miles checkout holds
a stand-in ``train.py`` (``miles_standin.py``) that does what a Miles run does at the file
level: it parses the arguments the backend owns, writes TensorBoard scalars under Miles' tags
with the same writer and steps Miles uses (``SummaryWriter`` into ``$TENSORBOARD_DIR``;
``train/*`` at ``rollout * steps_per_rollout + i``, ``rollout/*`` at the rollout) and
Megatron-layout checkpoints (``iter_NNNNNNN``, then the tracker file), and resumes from
``--load``. Everything else is real: a local Ray cluster with its job server, the job submitted
through Ray's job SDK with the entry point's argument list, ``run_single`` (``ablate
run-trial``) with the runner, the store, MLflow in the workdir and the verdict engine.

Cost: one Ray head with its dashboard (~10 s, shared by the module), three short jobs, one
submission to a port where nothing listens.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator import metrics as M
from orchestrator.exceptions import InfraFailure
from orchestrator.grid import expand, load_grid
from orchestrator.run import run_single
from orchestrator.slurm.raycluster import node_argv, remove_temp, stop_process

STANDIN = Path(__file__).with_name("miles_standin.py")
REPO = Path(__file__).resolve().parents[2]
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_jobs() -> Iterator[str]:
    """The job server of a one-node Ray cluster this module starts (``ray start --head``) and
    stops by its pid. Every port it opens is a free one: with Ray's fixed defaults (the
    dashboard agent's 52365) a Ray cluster another test runs at the same time holds the port,
    and jobs submitted here found no agent or never started."""
    port = _free_port()
    tmp = f"/tmp/rj{os.getpid()}"
    # A loopback test cluster: no token authentication (Ray 2.60 turns it on with a dashboard);
    # its nodes' python3 is this environment's (a Miles image's is Miles').
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    argv = node_argv(temp_dir=tmp, node="head", num_cpus=2, num_gpus=None,
                     head_port=_free_port(), node_ip="127.0.0.1", dashboard_port=port)
    head = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        address = f"http://127.0.0.1:{port}"
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 90
        while True:  # the job agent comes up a moment after the dashboard
            assert head.poll() is None, f"ray start exited with {head.returncode}"
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:  # not up yet: connection refused, 5xx
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield address
    finally:
        stop_process(head, grace=60)
        remove_temp(tmp)


def _grid(tmp: Path, address: str, *, steps: int = 4, **extra) -> Path:
    checkout = tmp / "miles"
    checkout.mkdir(exist_ok=True)
    shutil.copy(STANDIN, checkout / "train.py")
    catalog = tmp / "pools.yaml"
    catalog.write_text(yaml.safe_dump({"pools": {"h100": {
        "kind": "gpu", "accelerator": "H100", "gpus_per_node": 8,
        "miles": {"checkout": str(checkout), "ray_address": address}}}}))
    grid = {"name": "miles-launch", "recipe": "miles/qwen3_4b_dapo", "backend": "miles",
            "steps": steps, "pool": "h100", "pool_catalog": str(catalog),
            "checkpoint": {"every": 2, "keep": 3}, **extra}
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def _metrics(workdir: Path, trial_id: str) -> list[dict]:
    files = list(workdir.rglob(f"{trial_id}/metrics.jsonl"))
    assert files, f"no metrics of {trial_id} under {workdir}"
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_a_trial_runs_as_a_ray_job_and_its_metrics_and_checkpoints_come_back(
        tmp_path, ray_jobs) -> None:
    path = _grid(tmp_path, ray_jobs, overrides={"correction.is_level": "sequence"})
    trial = expand(load_grid(path))[0]
    result = run_single(str(path), trial.trial_id, workdir=str(tmp_path / "w"),
                        tracking_uri=None, fresh=False)
    assert result["state"] == "done", result
    rows = _metrics(tmp_path / "w", trial.trial_id)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # Miles' rollout r is step r + 1; k3 is the MIS function's (a MIS correction), the
    # entropy the negated entropy loss, the reward the rollout's raw reward.
    assert [round(r["metrics"][M.K3_KL], 6) for r in rows] == [0.001, 0.002, 0.003, 0.004]
    assert rows[0]["metrics"][M.ENTROPY] == pytest.approx(0.5)
    assert rows[0]["metrics"][M.TRAIN_REWARD] == pytest.approx(0.25)
    seen = json.loads((tmp_path / "miles" / "seen.json").read_text())
    assert seen["mis"]["tis_level"] == "sequence" and seen["cwd"] == str(tmp_path / "miles")
    assert "--custom-config-path" in seen["argv"] and "@MIS_YAML@" not in seen["argv"]
    stored = sorted(p.name for p in (tmp_path / "w").rglob(f"{trial.trial_id}/checkpoints/*")
                    if p.is_dir())
    assert stored, "no checkpoint was handed to the store"


def test_a_resumed_attempt_loads_the_stored_checkpoint_as_megatron_reads_it(
        tmp_path, ray_jobs) -> None:
    path = _grid(tmp_path, ray_jobs, overrides={"correction.is_level": "token"})
    trial = expand(load_grid(path))[0]
    (tmp_path / "miles" / "fail_at.txt").write_text("3")  # the job dies in rollout 3 (step 4)
    with pytest.raises(InfraFailure, match="failed after step 3: stand-in: dies in rollout 3"):
        run_single(str(path), trial.trial_id, workdir=str(tmp_path / "w"), tracking_uri=None,
                   fresh=False)
    second = run_single(str(path), trial.trial_id, workdir=str(tmp_path / "w"),
                        tracking_uri=None, fresh=False)
    assert second["state"] == "done", second
    seen = json.loads((tmp_path / "miles" / "seen.json").read_text())
    assert seen["loaded_iteration"] == 1  # the checkpoint of step 2, as Megatron's iteration 1
    assert [r["step"] for r in _metrics(tmp_path / "w", trial.trial_id)] == [1, 2, 3, 4]
    # A built-in TIS correction: k3 is Miles' own train_rollout_kl.
    assert _metrics(tmp_path / "w", trial.trial_id)[-1]["metrics"][M.K3_KL] == pytest.approx(0.4)


def test_a_job_server_that_does_not_answer_is_one_infra_failure_line(tmp_path) -> None:
    path = _grid(tmp_path, f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    trial = expand(load_grid(path))[0]
    with pytest.raises(InfraFailure, match=r"^the Ray job server http://127\.0\.0\.1:\d+ did "
                                           r"not take the job: [^\n]+$"):
        run_single(str(path), trial.trial_id, workdir=str(tmp_path / "w"), tracking_uri=None,
                   fresh=False)


def test_a_rising_k3_is_rescued_on_another_pool_and_compared_like_a_verl_trial(
        isolated, ray_jobs) -> None:
    """``ablate submit`` (Ray Tune) of a Miles grid: the stand-in's k3 (Miles' train_rollout_kl
    under a built-in TIS correction) climbs 0.1 a step on h100; a warning rule fires at step 3,
    the trial is stopped and moved to h200 (a checkout whose run has 100x less KL) from its
    step-2 checkpoint, as Megatron's iteration 1, and compare reports the rescue."""
    import csv
    import tempfile

    from orchestrator.compare import compare
    from orchestrator.scheduler import submit
    from orchestrator.store import TrialPaths, records, workspace

    path = _grid(isolated, ray_jobs, steps=6, overrides={"correction.is_level": "token"},
                 collapse={"extra_rules": [{"name": "k3_rising", "metric": M.K3_KL,
                                            "kind": "above", "threshold": 0.25, "patience": 1,
                                            "min_step": 2, "verdict": "unstable"}]},
                 rescue=[{"when": {"warning": "k3_rising"}, "resume": {"pool": "h200"}}])
    calm = isolated / "miles-h200"
    calm.mkdir()
    shutil.copy(STANDIN, calm / "train.py")
    (calm / "kl_scale.txt").write_text("0.01")
    catalog = yaml.safe_load((isolated / "pools.yaml").read_text())
    catalog["pools"]["h200"] = {**catalog["pools"]["h100"], "accelerator": "H200",
                                "miles": {"checkout": str(calm), "ray_address": ray_jobs}}
    (isolated / "pools.yaml").write_text(yaml.safe_dump(catalog))
    (trial,) = expand(load_grid(path))
    ray_tmp = tempfile.mkdtemp(prefix="mr", dir="/tmp")  # short: Ray's socket paths are capped
    try:
        summary = submit(str(path), progress=False, ray_tmp=ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    grid_dir = workspace.grid_dir("miles-launch")
    (note,) = records.load_state(TrialPaths(grid_dir, trial.trial_id), trial.trial_id).rescues
    assert (note["event"], note["step"], note["start"], note["pool"]) == (
        "warning:k3_rising", 3, 2, "h200"), note
    rescue = note["trial"]
    assert summary["rescued"] == [rescue], summary
    *_, ran = records.load_attempts(TrialPaths(grid_dir, rescue))
    assert (ran.pool, ran.outcome) == ("h200", "completed")
    seen = json.loads((calm / "seen.json").read_text())
    assert seen["loaded_iteration"] == 1  # the checkpoint of step 2, as Megatron's iteration 1
    k3 = {r["step"]: r["metrics"][M.K3_KL] for r in _metrics(isolated / ".ablate", rescue)}
    assert sorted(k3) == [1, 2, 3, 4, 5, 6] and k3[2] == pytest.approx(0.2)
    assert max(k3[s] for s in (3, 4, 5, 6)) < 0.01  # on h200, after the move
    (row,) = csv.DictReader((compare(str(path), out_dir=isolated / "res") / "rescues.csv")
                            .read_text().splitlines())
    assert (row["rescue"], row["parent"], row["event"]) == (rescue, trial.trial_id,
                                                            "warning:k3_rising"), row
