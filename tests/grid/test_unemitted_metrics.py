"""Metrics a trial's whole configuration will not emit (``Trainer.emits``), at every
launcher's entry: a grid's own collapse rule or search objective on one is refused before
anything starts (``ablate plan``, ``ablate submit`` on a Ray cluster, the Kubernetes and Slurm
dry runs), one line, exit 2; a default rule on one is not applicable to that trial, and the
verdict, its tags and ``compare`` say so instead of counting it as passed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import metrics as M
from orchestrator.backends import TrialConfig, backend
from orchestrator.cli import main
from orchestrator.compare._data import TrialResult, not_applicable_lines
from orchestrator.pools import load_catalog
from orchestrator.schema import CollapseSpec, EarlyStopSpec
from orchestrator.verdict import VerdictEngine, VerdictKind, judge

SKIP_RULE = "{name: skips, metric: fp16/skipped_share, kind: above, threshold: 0.5, patience: 3}"
# (backend, recipe, pool): each launcher with each trainer it runs.
LAUNCHERS = [("sim", "sim/grpo_tiny", "sim-h100"), ("verl", "verl/cpu_tiny", "cpu"),
             ("verl", "verl/qwen3_4b_dapo", "h100"), ("k8s", "verl/qwen3_4b_dapo", "h100"),
             ("slurm", "sim/grpo_tiny", "slurm-sim"), ("slurm", "verl/qwen3_4b_dapo", "slurm-h100")]
# Slurm places a trial only on a pool with a Slurm placement.
SLURM_POOLS = """pools:
  slurm-sim:
    kind: sim
    accelerator: H100 (emulated)
    sim_profile: {dtype: bf16, lm_head: bf16, kv_cache: fp8, reduction_order: chunked}
    slurm: {partition: cpu}
  slurm-h100:
    kind: gpu
    accelerator: H100
    gpus_per_node: 8
    slurm: {partition: gpu, gres: 'gpu:h100:8'}
"""


def _grid(tmp: Path, backend_name: str, recipe: str, pool: str, tail: str) -> Path:
    path = tmp / f"g-{backend_name}-{pool}.yaml"
    catalog = ""
    if pool.startswith("slurm-"):
        (tmp / "pools.yaml").write_text(SLURM_POOLS)
        catalog = "pool_catalog: pools.yaml\n"
    path.write_text(f"name: g\nrecipe: {recipe}\nbackend: {backend_name}\nsteps: 4\n"
                    f"pool: {pool}\n{catalog}{tail}")
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], isolated: Path) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err}"
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert out == "", out
    assert not (isolated / ".ablate").exists() and not (isolated / "out").exists()
    return err


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=[f"{b}-{p}" for b, _, p in LAUNCHERS])
def test_a_rule_on_the_loss_scalers_metric_is_refused_for_a_bf16_learner(
        launcher: tuple[str, str, str], isolated: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid(isolated, *launcher, "axes:\n  learner.precision: [bf16, fp16]\n"
                 f"collapse:\n  extra_rules: [{SKIP_RULE}]\n")
    entries = [["plan", str(grid)]]
    if launcher[0] in ("k8s", "slurm"):
        entries.append(["submit", str(grid), "--dry-run", "--out", str(isolated / "out")])
    else:  # a Ray cluster that does not exist: refused before it is asked anything
        entries.append(["submit", str(grid), "--address", "127.0.0.1:1"])
    for argv in entries:
        err = _refused(argv, capsys, isolated)
        assert f"error: {grid}" in err and "collapse.extra_rules[0].metric" in err, err
        assert "'fp16/skipped_share' is never emitted by the trials with learner.precision=bf16" \
            in err and "learner.precision: fp16" in err, err


def test_a_verl_recipe_without_evaluation_refuses_rules_and_objectives_on_the_eval_reward(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rule = _grid(isolated, "verl", "verl/cpu_tiny", "cpu", "collapse:\n  extra_rules: [{name: e, "
                 "metric: eval/reward, kind: drop_from_peak, threshold: 0.5}]\n")
    err = _refused(["plan", str(rule)], capsys, isolated)
    assert "metric 'eval/reward' is never emitted" in err and "trainer.test_freq: -1" in err, err
    # The search objective's default is eval/reward/final; a search grid's submit runs the
    # checks of its plan before it starts anything (it used to leave them to the first point).
    search = _grid(isolated, "verl", "verl/cpu_tiny", "cpu", "search:\n  params:\n"
                   "    actor_rollout_ref.actor.optim.lr: {low: 1.0e-6, high: 1.0e-5, log: true}\n"
                   "  budget: 2\n")
    for argv in (["plan", str(search)], ["submit", str(search), "--address", "127.0.0.1:1"]):
        err = _refused(argv, capsys, isolated)
        assert "search.objective.metric" in err and "'eval/reward'" in err, err
    # Evaluation switched on by the grid: the same objective plans.
    on = _grid(isolated, "verl", "verl/cpu_tiny", "cpu", "overrides:\n  trainer.test_freq: 2\n"
               "search:\n  params:\n"
               "    actor_rollout_ref.actor.optim.lr: {low: 1.0e-6, high: 1.0e-5, log: true}\n"
               "  budget: 2\n")
    assert main(["plan", str(on)]) == 0, capsys.readouterr().err


def test_default_rules_on_unemitted_metrics_are_not_applicable_never_passed() -> None:
    pools = load_catalog().pools
    b = backend("slurm")
    config = TrialConfig.of({"learner": {"precision": "bf16"}, "trainer": {"test_freq": -1}},
                            pools["cpu"])
    unemitted = b.unemitted(config)
    engine = VerdictEngine(CollapseSpec(), EarlyStopSpec(enabled=False), 4, unemitted=unemitted)
    for step in range(1, 5):  # an eval reward that halves would fire eval_reward_drop
        engine.observe(step, {M.TRAIN_REWARD: 0.5, M.GRAD_NORM: 0.3, M.K3_KL: 1e-4})
    verdict = engine.verdict(4, "completed")
    assert verdict.kind is VerdictKind.HEALTHY
    assert set(verdict.not_applicable) == {"eval_reward_drop", "fp16_skipped_updates"}
    assert "trainer.test_freq: -1" in verdict.not_applicable["eval_reward_drop"]
    assert verdict.reason.endswith("not applicable to this trial: eval_reward_drop, "
                                   "fp16_skipped_updates")
    tag = json.loads(verdict.tags()["verdict.not_applicable"])
    assert tag == dict(verdict.not_applicable)
    assert type(verdict).from_json(verdict.to_json()) == verdict
    # An fp16 learner with evaluation: every default rule applies, and runs.
    full = b.unemitted(TrialConfig.of({"learner": {"precision": "fp16"}}, pools["sim-h100"]))
    assert VerdictEngine(CollapseSpec(), EarlyStopSpec(), 4, unemitted=full).not_applicable == {}
    assert judge([(1, {M.TRAIN_REWARD: 0.5})], CollapseSpec()).tags()[
        "verdict.not_applicable"] == ""


def test_compare_lists_the_rules_that_did_not_run_with_why() -> None:
    def result(tid: str, na: dict[str, str]) -> TrialResult:
        return TrialResult(trial_id=tid, run_id="r" + tid, axes={}, seed=0, pool="cpu",
                           status="FINISHED", verdict="healthy", verdict_step=None,
                           verdict_reason="", derived_from=None, curves={}, latest={},
                           segments=[], not_applicable=na)
    why = "eval/reward: the recipe sets trainer.test_freq: -1"
    lines = not_applicable_lines([result("a", {"eval_reward_drop": why}), result("b", {})], str)
    assert f"- eval_reward_drop on 1 of 2 trials: {why}" in lines
    assert not_applicable_lines([result("b", {})], str) == []
