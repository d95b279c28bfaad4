"""The Slurm backend without a cluster: job scripts carry grid values as data (never as shell
text), the pool block refuses what is not one sbatch token, the dry run writes every trial's
script, and a machine without Slurm's clients is refused in one line before anything starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cliproc
import pytest
from slurmgrids import write_grid

from orchestrator.exceptions import GridError
from orchestrator.pools import PoolSpec, SlurmPlacement, load_catalog
from orchestrator.slurm.client import refusal
from orchestrator.slurm.script import job_script, sbatch_options

HOSTILE = "$(touch pwned); `touch pwned2` 'q\" a b\nc"


def test_job_script_passes_every_word_literally(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", HOSTILE]
    script = tmp_path / "job.sbatch"
    script.write_text(job_script(["--partition=pa"], argv, env={"ABLATE_X": HOSTILE},
                                 cwd=str(tmp_path)))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert json.loads(out.stdout) == [HOSTILE]
    assert not list(tmp_path.glob("pwned*"))
    assert "#SBATCH --partition=pa\n" in script.read_text()


@pytest.mark.parametrize("block", [{"partition": "gpu; rm -rf /"}, {"gres": "gpu:h100:8\n"},
                                   {"extra": ["--wrap=$(id)"]}, {"time_limit": "tomorrow"},
                                   {"qos": "a b"}])
def test_pool_block_takes_single_tokens_only(block: dict) -> None:
    with pytest.raises(ValueError):
        SlurmPlacement(**block)


def test_pool_block_error_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("pools:\n  x:\n    kind: sim\n    accelerator: a\n"
                                     "    slurm: {partition: 'a;b'}\n")
    with pytest.raises(GridError) as err:
        load_catalog(str(tmp_path / "p.yaml"))
    assert "pools.x.slurm.partition" in str(err.value) and "\n" not in str(err.value)


def test_sbatch_options_of_a_gpu_pool() -> None:
    pool = PoolSpec(name="g", kind="gpu", accelerator="H100", gpus_per_node=8,
                    slurm=SlurmPlacement(partition="gpu", account="lab", time_limit="90",
                                         extra=("--exclusive",)))
    opts = sbatch_options(pool, name="ablate-t1")
    assert opts == ["--job-name=ablate-t1", "--nodes=1", "--ntasks-per-node=1",
                    "--partition=gpu", "--account=lab", "--time=90", "--exclusive",
                    "--gpus-per-node=8"]


@pytest.mark.parametrize(("stderr", "key"), [
    (("sbatch: error: Batch job submission failed: Invalid account or account/partition "
     "combination specified"), "slurm.account"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", "slurm.qos"),
    (("sbatch: error: invalid partition specified: pz\nallocation failure: Invalid partition "
     "name specified"), "slurm.partition"),
    ("allocation failure: Requested node configuration is not available", "slurm.gres/constraint"),
])
def test_sbatch_refusal_names_pool_key_and_fix(stderr: str, key: str) -> None:
    msg = str(refusal("slurm-h100", stderr))
    assert msg.startswith(f"pool slurm-h100: {key}: sbatch refused") and "fix:" in msg
    assert "\n" not in msg


def test_dry_run_writes_job_scripts_with_values_as_data(tmp_path: Path) -> None:
    grid = write_grid(tmp_path, "slurm-dry", steps=4, pools=["slurm-h100", "slurm-a100"],
                      seeds=[0, 1], every=2, extra=f"description: {json.dumps(HOSTILE)}\n")
    (tmp_path / "dr" / "jobs").mkdir(parents=True)
    (tmp_path / "dr" / "jobs" / "t0000stale.sbatch").write_text("old")  # an earlier dry run's
    (tmp_path / "dr" / "jobs" / "notes.txt").write_text("mine")  # not the dry run's: kept
    (tmp_path / "afile").write_text("")
    with cliproc.ablate_env(tmp_path) as env:
        bad = cliproc.run(["submit", str(grid), "--dry-run", "--out", "afile"], env, tmp_path)
        res = cliproc.run(["submit", str(grid), "--dry-run", "--out", "dr"], env, tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--out afile" in bad.stderr and "is a file" in bad.stderr, bad.stderr
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "dr" / "jobs").iterdir() if p.suffix != ".sbatch"
                  ) == ["notes.txt"]
    assert not (tmp_path / "dr" / "jobs" / "t0000stale.sbatch").exists()
    index = json.loads((tmp_path / "dr" / "index.json").read_text())
    assert len(index["trials"]) == 4
    for t in index["trials"]:
        text = (tmp_path / "dr" / t["file"]).read_text()
        part = {"slurm-h100": "pa", "slurm-a100": "pb"}[t["pool"]]
        assert f"#SBATCH --partition={part}\n" in text
        assert "-m orchestrator.slurm.worker" in text and "pwned" not in text
    assert not (tmp_path / ".ablate" / "slurm-dry" / "trials").exists()  # nothing submitted


def test_no_slurm_clients_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    grid = write_grid(tmp_path, "slurm-none", steps=2, pools=["slurm-h100"], seeds=[0], every=1)
    with cliproc.ablate_env(tmp_path, {"PATH": str(tmp_path / "empty-bin")}) as env:
        res = cliproc.run(["submit", str(grid)], env, tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "backend slurm needs sbatch" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / ".ablate").exists()


def test_gpu_pool_without_placement_or_nodes_unlike_nnodes_refused_at_plan(tmp_path: Path) -> None:
    """A 2-node pool is fine for a 2-node trial; a trial whose trainer.nnodes (the recipe's 1)
    is not its pool's node count is refused: the job would hold nodes verl does not use."""
    extra = ("  bare-gpu:\n    kind: gpu\n    accelerator: H100\n    gpus_per_node: 8\n"
             "  two-nodes:\n    kind: gpu\n    accelerator: H100\n    gpus_per_node: 8\n"
             "    nodes: 2\n    slurm: {partition: gpu}\n")
    with cliproc.ablate_env(tmp_path, {"PATH": os.defpath}) as env:
        for pool, words in (("bare-gpu", "no slurm: placement"),
                            ("two-nodes", "nodes 2, but the trial's trainer.nnodes is 1")):
            grid = write_grid(tmp_path, f"g-{pool}", steps=2, pools=[pool], seeds=[0],
                              every=1, extra_pools=extra)
            text = grid.read_text().replace("recipe: sim/grpo_tiny", "recipe: verl/cpu_tiny")
            grid.write_text(text)
            res = cliproc.run(["plan", str(grid)], env, tmp_path)
            assert res.returncode == 2, res.stdout + res.stderr
            assert f"pool {pool}" in res.stderr and words in res.stderr, res.stderr


def test_a_rescue_to_a_pool_without_placement_is_refused_at_plan(tmp_path: Path) -> None:
    """A rescue's pool gets the trial pools' placement check at plan, not first when the
    rescue fires (after its parent collapsed, perhaps days into the grid)."""
    extra = ("  bare-gpu:\n    kind: gpu\n    accelerator: H100\n    gpus_per_node: 8\n"
             "  gpu-ok:\n    kind: gpu\n    accelerator: H100\n    gpus_per_node: 8\n"
             "    slurm: {partition: gpu}\n")
    with cliproc.ablate_env(tmp_path, {"PATH": os.defpath}) as env:
        grid = write_grid(tmp_path, "g-rescue", steps=2, pools=["gpu-ok"], seeds=[0], every=1,
                          extra_pools=extra,
                          extra="rescue:\n  - {when: collapsed, resume: {pool: bare-gpu}}\n")
        grid.write_text(grid.read_text().replace("recipe: sim/grpo_tiny", "recipe: verl/cpu_tiny"))
        res = cliproc.run(["plan", str(grid)], env, tmp_path)
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("warning: ")]
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert "pool bare-gpu: no slurm: placement" in lines[0], lines[0]
    assert "derived from" in lines[0], lines[0]  # the rescue's trial, planned with the grid's
    # The line and key are the rescue entry's pool, not the grid's own pool axis.
    assert lines[0].startswith(f"error: {grid}:12: rescue[0].resume.pool: "), lines[0]


def test_multi_node_verl_command_joins_the_jobs_ray() -> None:
    """On a multi-node job verl connects to the Ray the job started: the pool's ray_init
    resources move to each node's `ray start` (Ray refuses them from a connecting driver)."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.slurm.raycluster import NODE_RESOURCE, node_argv
    from orchestrator.verl.topology import ray_node_resources
    from orchestrator.verl.trainer import VerlTrainer

    pool = load_catalog().pools["cpu-fp32"].model_copy(update={"nodes": 2})
    assert ray_node_resources(pool) == (16, 1)
    grid = load_grid(str(Path(__file__).parents[2] / "grids" / "verl_cpu.yaml"))
    trial = expand(grid)[0]
    config = grid.trial_config(trial).updated({"trainer": {"nnodes": 2}}, pool=pool)
    argv = VerlTrainer.command(trial, config, checkpoint_dir="/c",
                               ray_address="127.0.0.1:6379")
    ray = [a for a in argv if a.lstrip("+").startswith("ray_kwargs.ray_init.")]
    assert ray == ["+ray_kwargs.ray_init.address='127.0.0.1:6379'"], ray
    assert "trainer.nnodes=2" in argv
    head = node_argv(temp_dir="/tmp/x", node="n1", num_cpus=16, num_gpus=1, head_port=6379)
    worker = node_argv(temp_dir="/tmp/y", node="n2", num_cpus=16, num_gpus=1,
                       address="127.0.0.1:6379")
    assert "--head" in head and "--address=127.0.0.1:6379" in worker
    assert f'--resources={{"{NODE_RESOURCE}n2": 1}}' in worker and "--num-gpus=1" in worker
    ports = [a for a in head + worker if a.endswith(tuple("0123456789")) and "-port=" in a]
    assert len({p.split("=")[1] for p in ports}) == len(ports)  # two nodes on one machine


def test_an_error_record_keeps_its_kind(tmp_path: Path) -> None:
    """What ended a job reaches the orchestrator as written: a user error stays a user error
    (not retried), not an infra failure whose reason is the writer's own TypeError."""
    from orchestrator.slurm.events import EventReader, EventWriter

    writer = EventWriter(tmp_path)
    writer.write("error", kind="user", message="UserError: fix the grid")
    writer.close()
    assert EventReader(tmp_path).poll() == [
        {"type": "error", "kind": "user", "message": "UserError: fix the grid"}]
