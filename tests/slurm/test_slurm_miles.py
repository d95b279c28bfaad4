"""A Miles trial as a Slurm job on the real test cluster (``backend: slurm-miles``): the job
starts Ray on both nodes of its allocation (n1 and n2, partition ``duo``, one GPU each) and runs
the Miles command as that cluster's driver.

Miles itself needs GPUs, so the pool's Miles checkout holds the stand-in ``train.py`` of the
Miles tests (``tests/miles/miles_standin.py``: Miles' arguments, TensorBoard tags and Megatron
checkpoint layout at the file level), which as a Ray driver asks the cluster what Miles'
placement groups would find there. Everything else is real: ``ablate submit --backend slurm``
on a grid whose file says ``backend: miles``, sbatch, the in-job worker, ``srun`` to the second
node, the events file, the store, MLflow and the verdict engine.

The first job's run dies in its third rollout, so the retry (a second job) resumes from the
checkpoint the first handed over: Megatron's layout, through the Slurm events file and back.

Cost: two 2-node jobs (two Ray nodes each, a 4-step stand-in run), about two minutes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import cliproc
import pytest
import yaml
from slurmgrids import job_ids
from trialrecords import mlflow_steps, trials

from orchestrator import metrics as M

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

STANDIN = Path(__file__).resolve().parents[1] / "miles" / "miles_standin.py"


def test_a_miles_trial_runs_as_a_slurm_job_with_ray_across_its_allocation(
        tmp_path: Path, slurm_cluster) -> None:
    checkout = tmp_path / "miles"
    checkout.mkdir()
    shutil.copy(STANDIN, checkout / "train.py")
    (checkout / "fail_at.txt").write_text("2")  # the first job dies in rollout 2 (step 3)
    pools = {"slurm-h100x2": {
        "kind": "gpu", "accelerator": "H100 (placeholder GRES) on partition duo", "nodes": 2,
        "gpus_per_node": 1, "slurm": {"partition": "duo", "gres": "gpu:1"},
        "miles": {"checkout": str(checkout)}}}
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump({"pools": pools}))
    grid = tmp_path / "miles-slurm.yaml"
    grid.write_text(yaml.safe_dump({
        "name": "miles-slurm", "recipe": "miles/qwen3_4b_dapo", "backend": "miles",
        "pool_catalog": "pools.yaml", "pool": "slurm-h100x2", "steps": 4, "seeds": [0],
        "checkpoint": {"every": 2, "keep": 3},
        "overrides": {"correction.is_level": "sequence"}}, sort_keys=False))
    with cliproc.ablate_env(tmp_path, slurm_cluster.env) as env:
        plan = cliproc.run(["plan", str(grid), "--backend", "slurm", "--json"], env, tmp_path)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert json.loads(plan.stdout)["backend"] == "slurm-miles"  # the grid's trainer, there
        res = cliproc.run(["submit", str(grid), "--backend", "slurm"], env, tmp_path,
                          timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    (t,) = trials(tmp_path / ".ablate" / "miles-slurm").values()
    assert t["state"].state.value == "done" and t["steps"] == [1, 2, 3, 4], t["state"]
    # The first job failed after step 2; the retry is a new job from the stored checkpoint of
    # step 2, laid out for Megatron as iteration 1 (what the stand-in read from --load).
    _first, job = job_ids(t["paths"].root)
    assert [a.outcome for a in t["attempts"]][-1] == "completed", t["attempts"]
    assert t["attempts"][0].outcome == "infra_failure" and t["attempts"][0].end_step == 2
    assert "dies in rollout 2" in (t["attempts"][0].reason or ""), t["attempts"][0]
    assert t["attempts"][1].resumed_from_step == 2, t["attempts"][1]
    shown = slurm_cluster.run(["scontrol", "-o", "show", "job", job])
    assert "NodeList=n[1-2] " in shown and "JobState=COMPLETED" in shown, shown
    # The driver saw one Ray node per Slurm node with the pool's GPUs, at the address the job
    # recorded, and ran with the job's Python (the Ray that started the nodes is the driver's).
    seen = json.loads((checkout / "seen.json").read_text())
    assert seen["loaded_iteration"] == 1, seen
    env1 = t["attempts"][-1].environment
    assert seen["ray"]["nodes"] == ["slurm_node_n1", "slurm_node_n2"], seen["ray"]
    assert seen["ray"]["gpus"] == 2 and seen["ray"]["address"] == env1["miles.ray_address"]
    assert env1["ray.nodes"] == "n1,n2" and env1["slurm.job_id"] == job, env1
    argv = seen["argv"]
    assert argv[argv.index("--actor-num-nodes") + 1] == "2"
    assert argv[argv.index("--actor-num-gpus-per-node") + 1] == "1"
    assert "--custom-config-path" in argv and seen["mis"]["tis_level"] == "sequence"
    # Metrics (the MIS function's k3) and checkpoints came back through the events file.
    rows = [json.loads(line) for line in (t["paths"].root / "metrics.jsonl").read_text()
            .splitlines()]
    assert [round(r["metrics"][M.K3_KL], 6) for r in rows] == [0.001, 0.002, 0.003, 0.004]
    stored = sorted(p.name for p in (t["paths"].root / "checkpoints").iterdir() if p.is_dir())
    assert stored, "no checkpoint reached the store"
    tracking = f"sqlite:///{tmp_path / '.ablate' / 'mlflow.db'}"
    assert mlflow_steps(tracking, t["state"].mlflow_run_id, M.K3_KL) == [1, 2, 3, 4]
    # Each Ray node recorded its workers on the way out (the cluster was stopped by pid).
    for node in ("n1", "n2"):
        assert (t["paths"].root / "logs" / "slurm-attempt-2" / "logs"
                / f"ray-node-{node}.json").is_file()
