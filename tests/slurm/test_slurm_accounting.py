"""Slurm with accounting storage (``conftest.slurm_accounting``: MariaDB + slurmdbd, associations
and QOS enforced): a trial's job status comes from ``sacct`` once the controller has forgotten
the job, and a pool whose ``account`` or ``qos`` the cluster refuses is refused in one line at
``ablate plan`` and ``ablate submit``, before anything is submitted."""
from __future__ import annotations

import time
from pathlib import Path

import cliproc
import pytest
from slurmgrids import job_ids
from trialrecords import trials

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

POOLS = """pools:
  acct-ok:
    kind: sim
    accelerator: H100 (emulated) on partition pacct
    sim_profile: {dtype: bf16, lm_head: bf16, kv_cache: fp8, reduction_order: chunked}
    slurm: {partition: pacct, account: lab, qos: fast}
  acct-badaccount:
    kind: sim
    accelerator: x
    sim_profile: {dtype: bf16}
    slurm: {partition: pacct, account: nope}
  acct-badqos:
    kind: sim
    accelerator: x
    sim_profile: {dtype: bf16}
    slurm: {partition: pacct, account: lab, qos: nope}
"""


def _grid(root: Path, name: str, pool: str, steps: int = 4) -> Path:
    (root / "pools.yaml").write_text(POOLS)
    path = root / f"{name}.yaml"
    path.write_text(f"name: {name}\nrecipe: sim/grpo_tiny\nbackend: slurm\n"
                    f"pool_catalog: pools.yaml\nsteps: {steps}\nseeds: [0]\npool: {pool}\n"
                    "checkpoint: {every: 2}\n")
    return path


def test_status_from_sacct_after_the_job_left_squeue(tmp_path: Path, slurm_accounting,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from orchestrator.slurm.client import SlurmClient

    grid = _grid(tmp_path, "acct-ok", "acct-ok")
    with cliproc.ablate_env(tmp_path, slurm_accounting.env) as env:
        res = cliproc.run(["submit", str(grid)], env, tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (t,) = trials(tmp_path / ".ablate" / "acct-ok").values()
    assert t["state"].state.value == "done" and t["steps"] == [1, 2, 3, 4]
    run = MlflowClient(f"sqlite:///{tmp_path / '.ablate' / 'mlflow.db'}").get_run(
        t["state"].mlflow_run_id)
    assert run.data.tags["verdict"] == "healthy"
    (job,) = job_ids(t["paths"].root)
    cluster = slurm_accounting.cluster
    deadline = time.monotonic() + 120  # MinJobAge=2: the controller purges it soon
    while "JobId=" in cluster.run(["scontrol", "-o", "show", "job", job], check=False):
        assert time.monotonic() < deadline, f"job {job} still known to scontrol"
        time.sleep(1)
    assert job not in cluster.run(["squeue", "-h", "-o", "%i"]).split()
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    state = SlurmClient().state(job)
    assert state is not None and (state.state, state.nodes) == ("COMPLETED", "a1"), state
    # Accounting charged the pool's account and QOS.
    row = cluster.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "Account,QOS"]).strip()
    assert row == "lab|fast", row


@pytest.mark.parametrize(("pool", "key"), [("acct-badaccount", "slurm.account"),
                                           ("acct-badqos", "slurm.qos")])
def test_bad_account_or_qos_refused_in_one_line(tmp_path: Path, slurm_accounting, pool: str,
                                                key: str) -> None:
    grid = _grid(tmp_path, f"bad-{pool}", pool)
    cluster = slurm_accounting.cluster
    queued = cluster.run(["squeue", "-h", "-o", "%i"]).split()
    with cliproc.ablate_env(tmp_path, slurm_accounting.env) as env:
        for cmd in (["plan", str(grid)], ["submit", str(grid)]):
            res = cliproc.run(cmd, env, tmp_path, timeout=120)
            lines = res.stderr.strip().splitlines()
            assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
            assert f"pool {pool}: {key}:" in lines[0] and "fix:" in lines[0], lines[0]
    assert not (tmp_path / ".ablate" / f"bad-{pool}" / "trials").exists()
    assert cluster.run(["squeue", "-h", "-o", "%i"]).split() == queued  # nothing submitted
