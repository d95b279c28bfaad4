"""Short jobs (``backends.short``: a probe's job run where a pool's trials run): a job run as a
module leaves its result, or its error as one line the orchestrator raises again, a user error
as a user error; a job that left neither is an infrastructure failure saying how it ended."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends import TrialConfig
from orchestrator.backends.short import ShortJob
from orchestrator.exceptions import InfraFailure, UserError
from orchestrator.grid import expand, load_grid
from orchestrator.probe import job as probe_job
from orchestrator.probe._report import TIME_COLUMNS
from orchestrator.sim.probe_job import SimProbe

REPO = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path) -> tuple[ShortJob, TrialConfig]:
    grid = load_grid(str(REPO / "grids" / "quickstart.yaml"))
    trial = expand(grid)[0]
    config = grid.trial_config(trial)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / probe_job.TASK).write_text(json.dumps(
        probe_job.task(SimProbe, trial, config, [0], 2)))
    return ShortJob("p1", config, {}, job_dir, probe_job.__name__), config


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows]


def _as_module(job: ShortJob) -> subprocess.CompletedProcess[str]:
    return subprocess.run(job.argv(), capture_output=True, text=True, timeout=120, check=False,
                          cwd=REPO)


def test_a_job_run_as_a_module_leaves_what_the_same_job_here_leaves(tmp_path) -> None:
    job, _ = _job(tmp_path)
    res = _as_module(job)
    assert res.returncode == 0, res.stderr
    job.check_ended("exit 0")
    there = json.loads(job.result.read_text())
    job.result.unlink()
    job.run_here()
    here = json.loads(job.result.read_text())
    assert there["engine"] == here["engine"]
    assert _untimed(there["rows"]) == _untimed(here["rows"]) and there["rows"]
    assert set(there["ran_on"]) == {"node", "slurm_job_id", "partition", "started", "ended"}


def test_a_failed_job_is_raised_again_as_one_line_of_its_kind(tmp_path) -> None:
    job, _ = _job(tmp_path)
    (job.job_dir / probe_job.TASK).write_text('{"job": ["orchestrator.sim.probe_job", ')
    res = _as_module(job)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    with pytest.raises(UserError) as err:  # a damaged task file is a state-file error
        job.check_ended("exit 1")
    assert "task.json" in str(err.value) and "\n" not in str(err.value)
    # A job that left nothing (killed on its node): how the launcher saw it end.
    (job.job_dir / "error.json").unlink()
    with pytest.raises(InfraFailure, match="ended without a result .NODE_FAIL"):
        job.check_ended("NODE_FAIL")


def test_an_engine_failure_in_the_job_is_an_infra_failure(tmp_path) -> None:
    job, _ = _job(tmp_path)
    task = (job.job_dir / probe_job.TASK).read_text()
    (job.job_dir / probe_job.TASK).write_text(task.replace('"batches": 2', '"batches": "x"'))
    res = _as_module(job)
    assert res.returncode == 1 and "Traceback" in res.stderr  # the job's log has it
    with pytest.raises(InfraFailure, match="ValueError"):
        job.check_ended("exit 1")
    assert not (job.job_dir / "result.json").exists()
    assert sys.executable in job.argv()
