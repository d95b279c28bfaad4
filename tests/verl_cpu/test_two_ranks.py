"""A real verl trial on the 2-rank ``cpu`` pool (two FSDP ranks on gloo), trained to its end and
then resumed on two ranks from its own checkpoint: what depends on the world size, for real.

verl writes one shard per rank (``model_world_size_2_rank_{0,1}.pt``); the orchestrator hands
them to the trial's store and lays them out again as ``global_step_2`` for the resumed attempt,
which verl loads on two ranks ("Resuming from ...") and continues with step 3. The opposite case,
a 1-rank checkpoint on two ranks, is refused by the pre-check (``test_grid_e2e.py``). About 3
minutes on a quiet 2-core machine (two verl start-ups). Needs ``pip install -e '.[verl]'``.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import cliproc
import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

TIMEOUT_S = 900


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_two_rank_trial_saves_a_shard_per_rank_and_resumes_from_them(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    grid = tmp_path / "verl_ws2.yaml"
    grid.write_text(textwrap.dedent("""\
        name: verl-ws2
        recipe: verl/cpu_tiny
        backend: verl
        steps: 3
        seeds: [0]
        pool: cpu
        budget: {max_parallel: 1}
        checkpoint: {every: 2, keep: 2}
        """))
    first = cliproc.run(["submit", str(grid)], cli_env, tmp_path, timeout=TIMEOUT_S)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    (root,) = (tmp_path / ".ablate" / "verl-ws2" / "trials").iterdir()
    assert json.loads((root / "state.json").read_text())["state"] == "done"
    shards = sorted(p.name for p in (root / "checkpoints" / "step-00000002" / "actor").glob("*.pt"))
    assert [s for s in shards if s.startswith("model_")] == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"], shards
    job = json.loads((root / "logs" / "job.attempt1.json").read_text())
    ranks = [t for t in job["processes"].values() if t.startswith("ray::WorkerDict")]
    assert len(ranks) == 2, job["processes"]  # one trainer process per rank

    second = cliproc.run(["resume", str(grid), "--trial", root.name, "--pool", "cpu",
                          "--from", "2"], cli_env, tmp_path, timeout=TIMEOUT_S)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    attempts = json.loads((root / "attempts.json").read_text())["attempts"]
    assert [(a["pool"], a["start_step"], a["end_step"], a["outcome"]) for a in attempts] == [
        ("cpu", 1, 3, "completed"), ("cpu", 3, 3, "completed")], attempts
    log = (root / "logs" / "verl.attempt2.log").read_text(errors="replace")
    assert any("Resuming from" in ln and "global_step_2" in ln for ln in log.splitlines()), log[-3000:]
    steps = [json.loads(ln)["step"] for ln in (root / "metrics.jsonl").read_text().splitlines()
             if ln.strip()]
    assert steps == [1, 2, 3], steps
