"""Real verl 0.9.1 GRPO trials on this CPU through ``ablate`` (issue 14), end to end.

One module-scoped ``ablate submit grids/verl_cpu.yaml`` (4 trials: IS level x {cpu-fp32,
cpu-bf16}, 3 steps each, a checkpoint every 2 steps; ~5 minutes on 2 cores) is shared by every
assertion below: MLflow runs with verl's own metric names and verdicts, the mismatch each pool
produces, ``ablate compare``'s tables, the checkpoints in each trial's store, and the
world-size pre-check of a ws1 -> ws2 resume. Bad inputs are refused before anything starts.
Needs ``pip install -e '.[verl]'`` (verl 0.9.1 + TransferQueue); no GPU, no network.
"""
from __future__ import annotations

import csv
import itertools
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cliproc
import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

REPO = Path(__file__).resolve().parents[2]
GRID = REPO / "grids" / "verl_cpu.yaml"
SUBMIT_TIMEOUT_S = 1500
# The module's grid is submitted once, in a fixture, within SUBMIT_TIMEOUT_S: pytest's default
# 600 s per test (the fixture's setup included) would cut it on a loaded machine.
pytestmark = pytest.mark.timeout(SUBMIT_TIMEOUT_S + 300)
VERL_METRICS = ("rollout_corr/k3_kl", "actor/grad_norm", "critic/score/mean")


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("verl_cpu_grid")
    with cliproc.ablate_env(tmp) as env:
        plan = cliproc.run(["plan", str(GRID), "--json"], env, tmp)
        assert plan.returncode == 0, plan.stderr
        trials = json.loads(plan.stdout)
        proc = cliproc.run(["submit", str(GRID)], env, tmp, timeout=SUBMIT_TIMEOUT_S)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        wd = tmp / ".ablate"
        yield {"tmp": tmp, "env": env, "trials": trials, "out": proc.stdout,
               "workdir": wd, "uri": f"sqlite:///{wd / 'mlflow.db'}"}


def _mlflow_runs(submitted: dict[str, Any]) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=submitted["uri"])
    exp = client.get_experiment_by_name("verl-cpu")
    assert exp is not None
    return client, client.search_runs([exp.experiment_id], max_results=100)


@pytest.mark.slow
def test_submit_logs_verl_metrics_and_verdicts_to_nested_mlflow_runs(submitted) -> None:
    client, runs = _mlflow_runs(submitted)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    parents = {r.info.run_id for r in runs if not r.data.tags.get("mlflow.parentRunId")}
    assert len(children) == 4 and parents
    assert {r.data.tags["mlflow.parentRunId"] for r in children} <= parents
    for run in children:
        assert set(VERL_METRICS) <= set(run.data.metrics), sorted(run.data.metrics)
        assert run.data.tags.get("verdict") in ("healthy", "collapsed", "unstable"), run.data.tags
        assert run.data.tags.get("verl.rollout") == "cpu"
        assert run.data.tags.get("verl.job.exit_code") == "0"
        history = client.get_metric_history(run.info.run_id, "rollout_corr/k3_kl")
        assert sorted(m.step for m in history) == [1, 2, 3]


@pytest.mark.slow
def test_each_attempt_records_what_the_cpu_engine_ran_with(submitted) -> None:
    """Engine provenance from the engine itself: its report lands in attempts.json and in the
    run's tags, and the dtype it loaded the model in is the pool's."""
    _, runs = _mlflow_runs(submitted)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    want = {"cpu-fp32": "float32", "cpu-bf16": "bfloat16"}
    for run in children:
        tags = run.data.tags
        assert tags["engine.name"] == "cpu" and tags["engine.version"].startswith("rl-ablate-")
        assert tags["engine.ran.dtype"] == want[run.data.params["pool"]], tags
        assert tags["engine.reports"] == "1" and tags["engine.unapplied"] == "none"
        trial_dir = submitted["workdir"] / "verl-cpu" / "trials" / tags["trial_id"]
        attempt = json.loads((trial_dir / "attempts.json").read_text())["attempts"][0]
        assert attempt["environment"]["engine.ran.dtype"] == tags["engine.ran.dtype"]
        assert attempt["environment"]["verl.rollout"] == "cpu"


@pytest.mark.slow
def test_pools_differ_only_by_the_rollout_dtype(submitted) -> None:
    """fp32 trainer + fp32 CPU rollout: k3 = 0; bf16 rollout: a small real mismatch."""
    _, runs = _mlflow_runs(submitted)
    k3 = {}
    for run in runs:
        if run.data.tags.get("mlflow.parentRunId"):
            k3.setdefault(run.data.params["pool"], []).append(run.data.metrics["rollout_corr/k3_kl"])
    assert max(k3["cpu-fp32"]) < 1e-9, k3
    assert all(1e-8 < v < 1e-3 for v in k3["cpu-bf16"]), k3


@pytest.mark.slow
def test_compare_writes_tables(submitted) -> None:
    out = submitted["tmp"] / "results"
    proc = cliproc.run(["compare", str(GRID), "--out", str(out)], submitted["env"], submitted["tmp"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = {p.suffix for p in out.rglob("*") if p.is_file()}
    assert {".md", ".csv", ".html"} <= written, sorted(str(p) for p in out.rglob("*"))


@pytest.mark.slow
def test_checkpoints_land_in_each_trials_store(submitted) -> None:
    trials = submitted["workdir"] / "verl-cpu" / "trials"
    ids = [p.name for p in trials.iterdir()]
    assert len(ids) == 4
    for tid in ids:
        step = trials / tid / "checkpoints" / "step-00000002"
        assert (step / "actor" / "model_world_size_1_rank_0.pt").is_file(), tid
        assert (step / "actor" / "optim_world_size_1_rank_0.pt").is_file(), tid


@pytest.mark.slow
def test_evaluate_scores_every_kept_checkpoint_with_the_fp32_reference(submitted) -> None:
    """``ablate evaluate`` on verl trials (issue 41): each kept checkpoint of each trial scored by
    the fp32 trainer-side forward (``verl/cpu/reference.py``) into ``reference.json``, once; the
    weights it loads are the ones verl synced into the fp32 rollout server (same fingerprint), and
    its greedy batch decode scores what the CPU engine's own decode loop gives on them."""
    import torch
    import yaml

    from orchestrator.verl.cpu import assets, reward
    from orchestrator.verl.cpu import reference as ref
    from orchestrator.verl.cpu.rollout import decoding, weights

    env, tmp = submitted["env"], submitted["tmp"]
    proc = cliproc.run(["evaluate", str(GRID)], env, tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trials = submitted["workdir"] / "verl-cpu" / "trials"
    config = yaml.safe_load((REPO / "recipes" / "verl" / "cpu_tiny.yaml").read_text())
    fp32_trials = []
    for trial in sorted(trials.iterdir()):
        kept = sorted(int(p.name.removeprefix("step-")) for p in (trial / "checkpoints").glob("step-*"))
        held = json.loads((trial / "reference.json").read_text())
        assert held["evaluator"] == ref.VERSION and held["target"] == "trainer", held
        assert sorted(int(s) for s in held["scores"]) == kept == [2, 3], (trial.name, held)
        assert all(0.0 <= v["reward"] <= 1.0 and v["seconds"] > 0 for v in held["scores"].values())
        if json.loads((trial / "spec.json").read_text())["pool"] == "cpu-fp32":
            fp32_trials.append((trial, held))
    assert len(fp32_trials) == 2
    trial, held = fp32_trials[0]
    step2 = trial / "checkpoints" / "step-00000002"
    model, tokenizer = ref.load_model(step2)
    syncs = {round(json.loads(ln)["fingerprint"], 6) for ln in
             (trial / "logs" / "weight_sync.attempt1.jsonl").read_text().splitlines() if ln.strip()}
    assert round(weights.fingerprint(model), 6) in syncs, (weights.fingerprint(model), syncs)
    spec = assets.spec_from_recipe(config["assets"])
    params = decoding.SamplingParams(max_new_tokens=config["data"]["max_response_length"],
                                     temperature=0.0, stop_token_ids=frozenset({tokenizer.eos_token_id}))
    sums = {"score": 0.0, "acc": 0.0}
    rows = assets.val_rows(spec)
    with torch.inference_mode():
        for row in rows:
            ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            out = decoding.decode(model, list(ids), params, torch.Generator().manual_seed(0))
            answer = tokenizer.decode(out.token_ids, skip_special_tokens=True)
            parts = reward.score_answer(answer, row["reward_model"]["ground_truth"])
            for part in sums:
                sums[part] += parts[part]
    # The recorded score is verl's core part (acc: the reward returns one), as eval/reward is.
    assert held["scores"]["2"]["reward"] == pytest.approx(sums["acc"] / len(rows), abs=1e-12)
    assert ref.score_parts(step2, config)["score"] == pytest.approx(sums["score"] / len(rows),
                                                                    abs=1e-12)
    again = cliproc.run(["evaluate", str(GRID)], env, tmp)
    assert again.returncode == 0 and "nothing to score" in again.stdout, again.stdout + again.stderr
    out = tmp / "results-ref"
    proc = cliproc.run(["compare", str(GRID), "--out", str(out)], env, tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with (out / "trials.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and all(float(r["final_reward_ref"]) >= 0 for r in rows), rows


# Ray actors running verl's classes (the driver is main_ppo); TransferQueue's actors are not
# verl processes and never import it.
VERL_PROCESSES = ("verl.trainer.main_ppo", "TaskRunner", "WorkerDict", "CpuRolloutServer",
                  "AgentLoopWorker", "RewardLoop", "GlobalRequestLoadBalancer")


@pytest.mark.slow
def test_evidence_kept_plugin_in_every_verl_process_weights_change_at_every_sync(
        submitted) -> None:
    """The trial's logs/ keeps what only the job can show: every verl process (named in the
    job summary) loaded the cpu plugin with the platform selected, and the rollout server's
    weights changed at every sync after the first (the trainer's update really arrived)."""
    trials = submitted["workdir"] / "verl-cpu" / "trials"
    for trial in trials.iterdir():
        logs = trial / "logs"
        job = json.loads((logs / "job.attempt1.json").read_text())
        verl_pids = {int(pid) for pid, title in job["processes"].items()
                     if any(name in title for name in VERL_PROCESSES)}
        loads = [json.loads(ln) for ln in (logs / "plugin_loads.attempt1.jsonl").read_text()
                 .splitlines() if ln.strip()]
        loaded = {rec["pid"] for rec in loads}
        assert all(rec["platform_selected"] for rec in loads), loads
        assert len(verl_pids) >= 5, job["processes"]  # driver, task runner, trainer, server, router
        assert verl_pids <= loaded, (sorted(verl_pids - loaded), job["processes"])
        syncs = sorted((json.loads(ln) for ln in (logs / "weight_sync.attempt1.jsonl")
                        .read_text().splitlines() if ln.strip()), key=lambda r: r["wall_time"])
        assert len(syncs) >= 3, syncs  # one before each of the 3 steps' rollouts
        assert syncs[0]["global_steps"] == 0  # the initial load: the weights the server has
        for before, after in itertools.pairwise(syncs):
            assert after["max_abs_change"] > 0 and after["fingerprint"] != before["fingerprint"]
        assert all(s["n_tensors"] == syncs[0]["n_tensors"] > 0 for s in syncs), syncs
        assert (logs / "verl.attempt1.log").stat().st_size > 0
        assert not (trial / "work").exists()  # the scratch space is gone, the evidence is not


@pytest.mark.slow
def test_ws1_checkpoint_resumed_on_two_ranks_is_refused_by_the_precheck(submitted) -> None:
    """verl 0.9.1 does not reshard: a ws1 checkpoint on the 2-rank cpu pool would fail inside
    the job (FileNotFoundError model_world_size_2_rank_0.pt); the pre-check says so first."""
    trials = submitted["workdir"] / "verl-cpu" / "trials"
    tid = min(p.name for p in trials.iterdir())
    before = (trials / tid / "attempts.json").read_text()
    proc = cliproc.run(["resume", str(GRID), "--trial", tid, "--pool", "cpu", "--from", "latest"],
                   submitted["env"], submitted["tmp"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "the checkpoint has 1" in lines[0] and "gives 2" in lines[0], lines[0]
    # cpu pools are one node: the way out is a pool with the checkpoint's rank count.
    assert "fix: resume on a cpu pool with 1 rank(s): cpu-fp32, cpu-bf16" in lines[0], lines[0]
    assert "model_merger" in lines[0], lines[0]
    assert (trials / tid / "attempts.json").read_text() == before  # nothing started


@pytest.mark.slow
def test_resume_on_another_cpu_pool_loads_verls_checkpoint(submitted) -> None:
    """A trial trained on cpu-fp32 continues from its step-2 checkpoint on cpu-bf16: verl
    loads the checkpoint the orchestrator laid out, step 3 is recomputed with a bf16 rollout."""
    tid = next(t["trial_id"] for t in submitted["trials"]["trials"]
               if t["pool"] == "cpu-fp32" and t["axes"]["correction.is_level"] == "none")
    proc = cliproc.run(["resume", str(GRID), "--trial", tid, "--pool", "cpu-bf16", "--from", "2"],
                   submitted["env"], submitted["tmp"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{tid}: resumed on cpu-bf16 from step 2" in proc.stdout
    root = submitted["workdir"] / "verl-cpu" / "trials" / tid
    attempts = json.loads((root / "attempts.json").read_text())["attempts"]
    assert [(a["pool"], a["start_step"], a["end_step"]) for a in attempts] == [
        ("cpu-fp32", 1, 3), ("cpu-bf16", 3, 3)]
    rows = [json.loads(ln) for ln in (root / "metrics.jsonl").read_text().splitlines() if ln]
    k3 = {r["step"]: (r.get("metrics") or r)["rollout_corr/k3_kl"] for r in rows}
    assert k3[1] == k3[2] == 0.0 and 1e-8 < k3[3] < 1e-3, k3


@pytest.mark.slow
def test_without_the_precheck_verl_fails_on_a_ws1_checkpoint_with_two_ranks(
        submitted, tmp_path: Path) -> None:
    """Why the pre-check exists: the job itself, given a 1-rank checkpoint on the 2-rank cpu
    pool, dies looking for the rank files verl 0.9.1 never reshards into."""
    from types import SimpleNamespace

    from orchestrator.exceptions import InfraFailure
    from orchestrator.grid import expand, load_grid
    from orchestrator.pools import load_catalog
    from orchestrator.verl.supervise import run_attempt
    from orchestrator.verl.trainer import VerlTrainer

    grid = load_grid(GRID)
    trial = next(t for t in expand(grid, force=True) if t.pool == "cpu-bf16"
                 and grid.trial_config(t)["correction"]["is_level"] == "token")
    store = submitted["workdir"] / "verl-cpu" / "trials" / trial.trial_id / "checkpoints"
    assert (store / "step-00000002" / "actor" / "model_world_size_1_rank_0.pt").is_file()
    logged: list[int] = []
    ctx = SimpleNamespace(
        trial=trial, pool=load_catalog().pools["cpu"], attempt=1, workdir=tmp_path / "work",
        log_dir=tmp_path / "logs",
        checkpoint_every=2, resume_step=2, grid_dir=submitted["workdir"] / "verl-cpu",
        log_metrics=lambda step, m: logged.append(step), save_checkpoint=lambda *a: None,
        checkpoint_path=lambda step: store / f"step-{step:08d}", should_stop=lambda: None,
        describe_environment=lambda facts: None)
    with pytest.raises(InfraFailure, match="verl exited with code"):
        run_attempt(VerlTrainer(), trial, grid.trial_config(trial, "cpu"), ctx)
    # The attempt made this process a subreaper for its job only (procs' docstring says why).
    from orchestrator.verl.cpu import procs

    assert not procs.is_subreaper()
    log = (tmp_path / "logs" / "verl.attempt1.log").read_text(errors="replace")
    missing = [ln for ln in log.splitlines() if "FileNotFoundError" in ln]
    assert any("model_world_size_2_rank_0.pt" in ln for ln in missing), log[-3000:]
    assert logged == []


# --------------------------------------------------------------------------- bad input


def _grid(tmp: Path, body: str) -> Path:
    path = tmp / "g.yaml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize("body,needle", [
    ("""\
     name: bad-fa3
     recipe: verl/cpu_tiny
     backend: verl
     steps: 2
     pool: cpu-fp32
     overrides: {rollout.attention_backend: fa3}
     """, "rollout.attention_backend: fa3"),
    ("""\
     name: bad-sim-on-cpu
     recipe: sim/grpo_tiny
     backend: sim
     steps: 2
     pool: cpu-fp32
     """, "pool 'cpu-fp32' is a cpu pool"),
    ("""\
     name: bad-verl-on-sim
     recipe: verl/cpu_tiny
     backend: verl
     steps: 2
     pool: sim-h100
     """, "pool 'sim-h100' is a sim pool"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path: Path, cli_env: dict[str, str],
                                                          body: str, needle: str) -> None:
    path = _grid(tmp_path, body)
    proc = cliproc.run(["submit", str(path)], cli_env, tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    wd = tmp_path / ".ablate"
    assert not wd.exists() or not any((wd / n).exists() for n in ("bad-fa3", "bad-sim-on-cpu",
                                                                  "bad-verl-on-sim"))
