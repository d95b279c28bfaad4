"""Verdict rules, early warning and early stop on synthetic metric streams shaped like the seeds."""
from __future__ import annotations

import json
import math

import pytest
import verdict_streams as V
from pydantic import ValidationError

from orchestrator import metrics as M
from orchestrator.schema import (
    CollapseRuleSpec,
    CollapseSpec,
    EarlyStopSpec,
    EarlyWarningSpec,
    GridFile,
)
from orchestrator.verdict import (
    DEFAULT_RULES,
    Verdict,
    VerdictEngine,
    VerdictKind,
    judge,
    resolve_rules,
)

SEEDS = range(10)
DEFAULT = CollapseSpec()


def run(stream: V.Stream, collapse: CollapseSpec = DEFAULT, early: EarlyStopSpec | None = None,
        steps: int | None = None) -> tuple[Verdict, int | None, str | None]:
    """Feed a stream like the runner does: stop at the first stop reason."""
    total = steps or stream[-1][0]
    engine = VerdictEngine(collapse, early or EarlyStopSpec(), total)
    for step, row in stream:
        reason = engine.observe(step, row)
        if reason:
            return engine.verdict(step, "stopped", reason), step, reason
    return engine.verdict(stream[-1][0], "completed"), None, None


@pytest.mark.parametrize("seed", SEEDS)
def test_explosion_collapses_with_k3_warning_ahead(seed: int) -> None:
    v = judge(V.explosion(seed=seed, onset=180), DEFAULT)
    assert v.kind is VerdictKind.COLLAPSED
    assert v.rule == "grad_norm_explosion" and v.step == 180
    assert v.values[M.GRAD_NORM] > 10 * v.values["reference"]
    # k3 starts rising 40 steps before the explosion; the warning must lead it.
    assert v.warning_step is not None and 140 < v.warning_step < 180
    assert v.lead_time == 180 - v.warning_step and v.lead_time >= 15


@pytest.mark.parametrize("seed", SEEDS)
def test_slow_reward_drift_collapses(seed: int) -> None:
    v = judge(V.slow_collapse(seed=seed, start=150), DEFAULT)
    assert v.kind is VerdictKind.COLLAPSED
    assert v.rule in ("train_reward_drop", "eval_reward_drop")
    assert 190 <= v.step <= 230  # half of the ~0.7 peak is gone ~50 steps into the drift
    assert v.warning_step is None and v.lead_time is None


@pytest.mark.parametrize("maker", [V.healthy, V.noisy_healthy, V.slow_drift_healthy])
@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_streams_stay_healthy_and_run_to_the_end(maker, seed: int) -> None:
    v, stopped_at, _ = run(maker(seed=seed), early=EarlyStopSpec(enabled=True, on_warning=True, margin=10))
    assert v.kind is VerdictKind.HEALTHY, v.reason
    assert stopped_at is None and not v.stopped_early and v.steps_saved == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_dip_that_recovers_is_unstable_not_collapsed(seed: int) -> None:
    v = judge(V.dip_and_recover(seed=seed, start=120, length=25), DEFAULT)
    assert v.kind is VerdictKind.UNSTABLE
    assert "recovered" in v.reason and v.rule == "train_reward_drop"


def test_early_stop_margin_spares_a_dip_that_recovers() -> None:
    stream = V.dip_and_recover(seed=3, start=120, length=25)
    eager, at, _ = run(stream, early=EarlyStopSpec(margin=0))
    assert at is not None and eager.kind is VerdictKind.COLLAPSED  # the price of margin 0
    patient, at, _ = run(stream, early=EarlyStopSpec(margin=30))
    assert at is None and patient.kind is VerdictKind.UNSTABLE


def test_early_stop_on_explosion_records_steps_saved() -> None:
    v, at, reason = run(V.explosion(seed=1, onset=180), early=EarlyStopSpec(margin=5), steps=300)
    assert at is not None and 185 <= at <= 190
    assert reason is not None and "grad_norm_explosion" in reason
    assert v.kind is VerdictKind.COLLAPSED and v.stopped_early and v.steps_saved == 300 - at
    assert v.step == 180  # the verdict step is the onset, not the stop


def test_on_warning_stops_before_the_collapse() -> None:
    v, at, reason = run(V.explosion(seed=2, onset=180),
                        early=EarlyStopSpec(on_warning=True, margin=5), steps=300)
    assert at is not None and at < 180 and "early warning" in (reason or "")
    # Stopped on a warning only: nothing collapsed yet, so the verdict says healthy so far.
    assert v.kind is VerdictKind.HEALTHY and v.stopped_early and v.steps_saved == 300 - at
    assert v.warning_step is not None and v.warning_step <= at


def test_early_stop_disabled_never_stops_but_judges() -> None:
    v, at, _ = run(V.explosion(seed=0), early=EarlyStopSpec(enabled=False))
    assert at is None and v.kind is VerdictKind.COLLAPSED and not v.stopped_early


def test_nonfinite_is_numeric_failure_and_stops_even_without_early_stop() -> None:
    v, at, reason = run(V.with_nan(at=60), early=EarlyStopSpec(enabled=False))
    assert at == 60 and "non-finite" in (reason or "")
    assert v.kind is VerdictKind.NUMERIC_FAILURE and v.step == 60


def test_outcomes_infra_and_cancelled() -> None:
    engine = VerdictEngine(DEFAULT, EarlyStopSpec(), 300)
    for step, row in V.healthy(seed=0)[:80]:
        engine.observe(step, row)
    infra = engine.verdict(80, "infra_failure", "node lost")
    assert infra.kind is VerdictKind.INFRA_FAILURE and infra.reason == "node lost" and infra.step == 80
    cancelled = engine.verdict(80, "cancelled")
    assert cancelled.kind is VerdictKind.HEALTHY and "cancelled" in cancelled.reason
    with pytest.raises(ValueError):
        engine.verdict(80, "exploded")


def test_collapse_before_an_infra_failure_is_still_a_collapse() -> None:
    engine = VerdictEngine(DEFAULT, EarlyStopSpec(enabled=False), 300)
    for step, row in V.explosion(seed=0, onset=100)[:120]:
        engine.observe(step, row)
    assert engine.verdict(120, "infra_failure", "oom").kind is VerdictKind.COLLAPSED


def test_replay_is_deterministic_and_ignores_repeated_steps() -> None:
    stream = V.explosion(seed=4, onset=150)
    full = judge(stream, DEFAULT)
    # A resumed runner: a fresh engine replays the committed prefix, then the new attempt
    # re-sends some steps (ignored) and continues.
    engine = VerdictEngine(DEFAULT, EarlyStopSpec(enabled=False), 300)
    for step, row in stream[:120]:
        engine.observe(step, row)
    for step, row in stream[100:]:
        engine.observe(step, row)
    assert engine.verdict(300, "completed") == full


def test_verdict_json_and_tags_round_trip() -> None:
    v = judge(V.explosion(seed=0), DEFAULT)
    again = Verdict.from_json(json.loads(json.dumps(v.to_json())))
    assert again == v
    tags = v.tags()
    assert tags["verdict"] == "collapsed" and tags["verdict.step"] == "180"
    assert tags["verdict.rule"] == "grad_norm_explosion" and tags["verdict.lead_time"] == str(v.lead_time)
    assert all(isinstance(x, str) for x in tags.values())
    nan = judge(V.with_nan(), DEFAULT)
    assert Verdict.from_json(json.loads(json.dumps(nan.to_json()))).kind is VerdictKind.NUMERIC_FAILURE


def test_grid_rules_replace_extend_or_disable_defaults() -> None:
    mine = CollapseRuleSpec(name="low_entropy", metric=M.ENTROPY, kind="below", threshold=0.2, patience=3)
    assert [r.name for r in resolve_rules(CollapseSpec(rules=[mine]))] == ["low_entropy"]
    assert resolve_rules(CollapseSpec(rules="none")) == ()
    extended = resolve_rules(CollapseSpec(extra_rules=[mine]))
    assert len(extended) == len(DEFAULT_RULES) + 1
    # An extra rule with a default's name replaces it (e.g. a stricter grad-norm threshold).
    strict = CollapseRuleSpec(name="grad_norm_explosion", metric=M.GRAD_NORM, kind="explode", threshold=3.0)
    replaced = {r.name: r for r in resolve_rules(CollapseSpec(extra_rules=[strict]))}
    assert replaced["grad_norm_explosion"].threshold == 3.0
    # entropy falls below 0.8 after ~step 263 of the healthy stream: the custom rule fires, defaults don't.
    v = judge(V.healthy(seed=0), CollapseSpec(rules=[
        CollapseRuleSpec(name="low_entropy", metric=M.ENTROPY, kind="below", threshold=0.8, patience=3)]))
    assert v.kind is VerdictKind.COLLAPSED and v.rule == "low_entropy" and 255 <= v.step <= 270
    assert judge(V.explosion(seed=0), CollapseSpec(rules="none", early_warning=False)).kind is VerdictKind.HEALTHY


def test_collapse_section_in_grid_file_schema() -> None:
    base = {"name": "g", "recipe": "sim/grpo_tiny", "steps": 10}
    spec = GridFile.model_validate({**base, "collapse": {
        "rules": "default",
        "extra_rules": [{"name": "k3_hard", "metric": M.K3_KL, "kind": "above", "threshold": 1.0,
                         "patience": 5}],
        "early_warning": {"ratio": 5.0, "lag": 30}},
        "early_stop": {"margin": 10, "on_warning": False}})
    assert isinstance(spec.collapse.warning_spec, EarlyWarningSpec)
    assert spec.collapse.warning_spec.ratio == 5.0 and spec.early_stop_spec.margin == 10
    assert GridFile.model_validate({**base, "collapse": {"early_warning": False}}).collapse.warning_spec is None
    with pytest.raises(ValidationError):
        GridFile.model_validate({**base, "collapse": {"extra_rules": [
            {"name": "x", "metric": "m", "kind": "explodes"}]}})
    with pytest.raises(ValidationError):
        GridFile.model_validate({**base, "collapse": {"early_warning": {"ratio": 0.5}}})


def test_grid_file_with_collapse_rules_loads(isolated, repo) -> None:
    from orchestrator.exceptions import GridError
    from orchestrator.grid import load_grid

    text = (repo / "grids" / "quickstart.yaml").read_text()
    good = isolated / "g.yaml"
    good.write_text(text + "collapse:\n  extra_rules:\n    - {name: k3_hard, metric: rollout_corr/k3_kl, "
                    "kind: above, threshold: 1.0, patience: 5}\nearly_stop: {margin: 10}\n")
    grid = load_grid(good)
    assert [r.name for r in resolve_rules(grid.spec.collapse)][-1] == "k3_hard"
    bad = isolated / "bad.yaml"
    bad.write_text(text + "collapse:\n  extra_rules:\n    - {name: x, metric: m, kind: explods}\n")
    with pytest.raises(GridError) as err:
        load_grid(bad)
    assert "collapse" in str(err.value) and "\n" not in str(err.value)


def test_engine_ignores_missing_and_sparse_metrics() -> None:
    engine = VerdictEngine(DEFAULT, EarlyStopSpec(), 50)
    for step in range(1, 51):
        assert engine.observe(step, {M.TIME_PER_STEP: 0.1}) is None
    v = engine.verdict(50, "completed")
    assert v.kind is VerdictKind.HEALTHY and math.isnan(v.values.get("x", math.nan))


def _sim_run(overrides: dict, steps: int, early: EarlyStopSpec, tmp_path):
    """One real simulator trial with the engine driving early stop live, as the runner does."""
    pytest.importorskip("torch")
    from orchestrator.grid import load_grid
    from orchestrator.sim.job import SimTrainer
    from orchestrator.sim.local import LocalContext

    axes = "\n".join(f"  {k}: [{v}]" for k, v in overrides.items())
    gfile = tmp_path / "g.yaml"
    gfile.write_text(f"name: simv\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: {steps}\nseeds: [0]\n"
                     f"pool: sim-a100\naxes:\n{axes}\n")
    from orchestrator.grid import expand

    grid = load_grid(gfile)
    trial = expand(grid)[0]
    engine = VerdictEngine(grid.spec.collapse, early, steps)
    ctx = LocalContext(trial=trial, pool=grid.pools.get(trial.pool), workdir=tmp_path / "w")
    stop: dict[str, object] = {}

    def on_step(step: int, metrics) -> None:
        reason = engine.observe(step, metrics)
        if reason and "reason" not in stop:
            stop["reason"], ctx.stop_at = reason, step

    ctx.on_step = on_step
    result = SimTrainer().run(trial, grid.trial_config(trial), ctx)
    outcome = {"completed": "completed", "stopped": "stopped"}.get(result.outcome.value, "numeric_failure")
    return engine.verdict(result.last_step, outcome, result.reason), result, ctx


@pytest.mark.slow
def test_real_sim_collapse_is_detected_and_stopped_early(isolated) -> None:
    """MoE with stale rollout weights and a high LR. Measured on this simulator (pinned
    numerics, so on any x86-64 AVX2 machine): the mismatch warning fires at step 55, the train
    reward falls from 0.116 to 0.004 and the verdict is "collapsed at step 64", stopped live at
    step 73. The engine must call it a collapse and stop it live."""
    v, result, ctx = _sim_run({"model.arch": "moe", "train.lr": 1.0e-2, "rollout.weight_lag": 2,
                               "train.ppo_epochs": 2}, 120, EarlyStopSpec(margin=5), isolated)
    assert v.kind is VerdictKind.COLLAPSED, v.reason
    assert result.outcome.value == "stopped" and v.stopped_early
    stopped_at = max(ctx.metrics)
    assert v.steps_saved == 120 - stopped_at > 0
    assert v.step is not None and v.step < stopped_at
    assert v.warning_step is not None  # k3 rises from ~0.05 to > 1: the mismatch warning fires


@pytest.mark.slow
def test_real_sim_healthy_run_is_not_stopped(isolated) -> None:
    v, result, _ = _sim_run({"model.arch": "dense", "train.lr": 1.0e-3}, 60, EarlyStopSpec(margin=5),
                            isolated)
    assert result.outcome.value == "completed" and not v.stopped_early
    assert v.kind is VerdictKind.HEALTHY, v.reason


def test_relapse_after_recovery_is_judged_on_its_own() -> None:
    """Dip at 120 (recovers), relapse from 220: margin 30 spares the dip, stops on the relapse."""
    stream = V.dip_and_recover(seed=5, start=120, length=25)
    for step, row in stream:
        if step >= 220:
            row[M.TRAIN_REWARD] = 0.02
            row.pop(M.EVAL_REWARD, None)
    v, at, reason = run(stream, early=EarlyStopSpec(margin=30), steps=300)
    assert at is not None and 250 <= at <= 265, at
    assert "train_reward_drop fired at step 2" in (reason or "")  # the relapse, not the dip at 12x
    assert v.kind is VerdictKind.COLLAPSED and v.step is not None and v.step >= 220
    full = judge(stream, DEFAULT)
    assert full.kind is VerdictKind.COLLAPSED and full.step == v.step


_NO_FLOOR = CollapseRuleSpec(name="grad_norm_explosion", metric=M.GRAD_NORM, kind="explode",
                             threshold=10.0, window=20, patience=3, min_step=5)  # min_delta 0


@pytest.mark.parametrize("seed", SEEDS)
def test_ordinary_gradients_after_entropy_collapse_are_not_an_explosion(seed: int) -> None:
    """Grad-norm median ~0.004 after the policy turned deterministic, then ordinary 0.5 gradients:
    100x the median. Without the absolute floor that was a collapse at step 160."""
    stream = V.entropy_collapse_then_ordinary(seed=seed, collapse_at=100, resume_at=160)
    v = judge(stream, DEFAULT)
    assert v.kind is VerdictKind.HEALTHY, v.reason
    old = judge(stream, CollapseSpec(extra_rules=[_NO_FLOOR]))  # the stream does reproduce it
    assert old.kind is VerdictKind.COLLAPSED and old.rule == "grad_norm_explosion" and old.step == 160


@pytest.mark.parametrize("seed", SEEDS)
def test_real_explosion_after_entropy_collapse_still_fires(seed: int) -> None:
    stream = V.entropy_collapse_then_ordinary(seed=seed, collapse_at=100, resume_at=160, explode_at=220)
    v = judge(stream, DEFAULT)
    assert v.kind is VerdictKind.COLLAPSED and v.rule == "grad_norm_explosion" and v.step == 220
    assert v.values[M.GRAD_NORM] - v.values["reference"] >= 1.0
    assert "above it" in v.reason  # the floor is part of the explanation


def test_grad_norm_floor_is_set_in_the_grid(isolated, repo) -> None:
    """``collapse.extra_rules`` with the default's name replaces its min_delta."""
    from orchestrator.grid import load_grid

    text = (repo / "grids" / "quickstart.yaml").read_text()
    g = isolated / "g.yaml"
    g.write_text(text + "collapse:\n  extra_rules:\n    - {name: grad_norm_explosion, metric: actor/grad_norm, "
                 "kind: explode, threshold: 10, window: 20, patience: 3, min_step: 5, min_delta: 100}\n")
    collapse = load_grid(g).spec.collapse
    rule = {r.name: r for r in resolve_rules(collapse)}["grad_norm_explosion"]
    assert rule.min_delta == 100
    # Explosions of 30..300 (the floor-test stream) no longer clear a floor of 100 for 3 steps
    # in a row at their start; the default floor (1.0) catches them at 220.
    stream = V.entropy_collapse_then_ordinary(seed=0, explode_at=220)
    assert judge(stream, collapse).step != 220 and judge(stream, DEFAULT).step == 220


def test_flat_near_zero_reward_is_not_a_collapse(monkeypatch) -> None:
    """A run that never learns (reward 0.03 +- 0.02): any dip is half of its near-zero peak and
    more than min_delta, but within the series' own noise. The noise floor keeps it healthy."""
    import orchestrator.verdict._detectors as verdict_mod

    kinds = [judge(V.flat_near_zero_reward(seed=s), DEFAULT).kind for s in range(20)]
    assert kinds.count(VerdictKind.HEALTHY) >= 19 and kinds.count(VerdictKind.COLLAPSED) <= 1
    monkeypatch.setattr(verdict_mod, "NOISE_SIGMAS", 0.0)  # without it: collapsed or unstable
    old = [judge(V.flat_near_zero_reward(seed=s), DEFAULT).kind for s in range(20)]
    assert old.count(VerdictKind.HEALTHY) == 0


def test_entropy_blowup_rule_needs_a_floor_near_zero() -> None:
    """A grid's own entropy blow-up rule: entropy ~0.001 flickering to 0.05 is 50x its minimum.
    min_delta (an absolute rise of 0.5 nats) keeps it quiet; without it, it fires."""
    stream = V.entropy_collapse_then_ordinary(seed=1, collapse_at=100, resume_at=160)
    rule = {"name": "entropy_blowup", "metric": M.ENTROPY, "kind": "blowup", "threshold": 10.0,
            "window": 5, "patience": 5, "min_step": 5}
    bare = judge(stream, CollapseSpec(rules=[CollapseRuleSpec(**rule)], early_warning=False))
    assert bare.kind is VerdictKind.COLLAPSED and bare.rule == "entropy_blowup"
    floored = judge(stream, CollapseSpec(rules=[CollapseRuleSpec(**rule, min_delta=0.5)], early_warning=False))
    assert floored.kind is VerdictKind.HEALTHY, floored.reason


NO_GRADIENT = {"name": "no_gradient", "metric": M.GRAD_NORM, "kind": "below",
               "threshold": 1e-8, "window": 1, "patience": 10, "min_step": 5}


@pytest.mark.parametrize("seed", SEEDS)
def test_zero_gradients_of_a_converged_policy_are_not_a_default_collapse(seed: int) -> None:
    """Grad norm exactly 0 from step 150 with the reward frozen where it was (every group scores
    alike): by default that is convergence, not collapse; a grid can opt in to the rule."""
    v = judge(V.dead_policy(seed=seed, at=150), DEFAULT)
    assert v.kind is VerdictKind.HEALTHY, v.reason
    opted = CollapseSpec(extra_rules=[CollapseRuleSpec(**NO_GRADIENT)])
    v = judge(V.dead_policy(seed=seed, at=150), opted)
    assert v.kind is VerdictKind.COLLAPSED and v.rule == "no_gradient" and v.step == 150, v.reason
    healthy = judge(V.dead_policy(seed=seed, at=None, blips=8), opted)  # isolated zero-grad batches
    assert healthy.kind is VerdictKind.HEALTHY, healthy.reason


@pytest.mark.parametrize("seed", range(5))
def test_a_partial_comeback_is_not_a_recovery(seed: int) -> None:
    """The reward loses 70% at step 120 and comes back only to 55% of its peak: still collapsed
    (hysteresis). Back to 90% of the peak, the same dip is a recovery (unstable)."""
    for level, kind in ((0.55, VerdictKind.COLLAPSED), (0.9, VerdictKind.UNSTABLE)):
        stream = V.dip_and_recover(seed=seed, start=120, length=25)
        for step, row in stream:
            if step >= 145:
                row[M.TRAIN_REWARD] *= level
                if M.EVAL_REWARD in row:
                    row[M.EVAL_REWARD] *= level
        v = judge(stream, DEFAULT)
        assert v.kind is kind, (level, v.reason)
        assert v.rule == "train_reward_drop" and 120 <= (v.step or 0) <= 135


def test_early_stop_margin_counts_consecutive_holds() -> None:
    """A fired rule whose reward keeps coming back part of the way (past the firing threshold,
    short of recovery) never holds for `margin` observations in a row: no stop, and a collapsed
    verdict at the end. The same drop held steadily is stopped."""
    def stream(flicker: bool) -> V.Stream:
        rows = V.dip_and_recover(seed=3, start=120, length=200)  # the drop lasts to the end
        for step, row in rows:
            row.pop(M.EVAL_REWARD, None)  # judge the train reward alone
            if flicker and step >= 130 and step % 16 < 8:
                row[M.TRAIN_REWARD] = 0.45  # ~64% of the 0.7 peak: between the two thresholds
        return rows

    steady, at_steady, _ = run(stream(False), early=EarlyStopSpec(margin=20), steps=300)
    assert at_steady is not None and steady.kind is VerdictKind.COLLAPSED
    flickering, at_flicker, _ = run(stream(True), early=EarlyStopSpec(margin=20), steps=300)
    assert at_flicker is None, flickering.reason
    assert flickering.kind is VerdictKind.COLLAPSED  # never recovered either
