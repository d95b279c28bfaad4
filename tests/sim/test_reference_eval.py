"""The simulator's reference evaluator (``eval: {reference: trainer}``, ``sim/reference.py``):
it leaves the trial's own numbers untouched, scores every arm alike, and a checkpoint scored
after the fact gives the number the trial logged at that step."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator import metrics as M

STEPS = 6
# sim-a100: int4 weights, fp8 head and a weight lag, the engine furthest from the trainer.
ARM = {"correction.is_level": "token"}
REF = {"eval.reference": "trainer"}


@pytest.fixture(scope="module")
def runs(sim, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for name, extra in (("plain", {}), ("ref", REF)):
        tmp = tmp_path_factory.mktemp(name)
        result, ctx = sim.run(tmp, sim.pool("sim-a100"), STEPS, {**ARM, **extra}, seed=3, every=3)
        assert result.last_step == STEPS, result
        out[name] = (tmp, ctx)
    return out


def test_the_reference_changes_none_of_the_trials_own_numbers(runs, sim) -> None:
    plain = sim.no_timing(runs["plain"][1].metrics)
    ref = sim.no_timing(runs["ref"][1].metrics)
    own = {s: {k: v for k, v in m.items() if k != M.EVAL_REWARD_REF} for s, m in ref.items()}
    assert own == plain  # every metric of every step, bit for bit
    logged = {s: m[M.EVAL_REWARD_REF] for s, m in ref.items() if M.EVAL_REWARD_REF in m}
    assert sorted(logged) == [3, 6]  # the eval steps (FAST: eval.every 3)
    assert all(0.0 <= v <= 1.0 for v in logged.values())
    assert all(runs["ref"][1].metrics[s][M.TIME_EVAL_REF] > 0 for s in logged)
    assert not any(M.EVAL_REWARD_REF in m for m in plain.values())


def _trainer(sim, pool: str, seed: int, overrides: dict[str, Any] | None = None) -> Any:
    from orchestrator.sim.config import build_setup
    from orchestrator.sim.model import ModelConfig
    from orchestrator.sim.task import Task
    from orchestrator.sim.trainer import GRPOTrainer, TrainConfig

    setup = build_setup(sim.config({**REF, **(overrides or {})}), sim.pool(pool))
    task = Task(**setup.task)
    model = ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model)
    return GRPOTrainer(model, task, TrainConfig(**setup.train), setup.correction,
                       setup.numerics, seed, setup.learner)


def test_every_arm_is_scored_by_the_same_evaluator(sim) -> None:
    """Same weights and seed, different pools and engine flags: the same reference score, while
    each arm's own engine scores differently."""
    arms = [_trainer(sim, "sim-a100", 5), _trainer(sim, "sim-h100", 5),
            _trainer(sim, "sim-h20", 5, {"rollout.kv_cache_dtype": "fp8"})]
    refs = {t.evaluate_reference(30) for t in arms}
    assert len(refs) == 1
    own = {t.evaluate(30) for t in arms}
    assert len(own) > 1  # the arms' own engines disagree on the very same weights


def test_a_checkpoint_scored_after_the_fact_matches_the_logged_number(runs, sim) -> None:
    _, ctx = runs["ref"]
    for step in (3, 6):
        trainer = _trainer(sim, "sim-a100", 3, ARM)
        assert trainer.load(Path(ctx.checkpoint_path(step))) == step
        assert trainer.evaluate_reference(step) == ctx.metrics[step][M.EVAL_REWARD_REF]


def test_the_trainer_records_the_evaluators_version() -> None:
    from orchestrator.sim import reference
    from orchestrator.sim.evaluator import SimEvaluator

    assert SimEvaluator.version == reference.VERSION
