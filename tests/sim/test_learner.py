"""``learner.*`` on the simulator: every loss and precision trains for real, reproducibly, and
the true on-policy bundle has exactly zero mismatch while the samples of a prompt differ."""
from __future__ import annotations

import pytest
import torch

from orchestrator import metrics as M
from orchestrator.backends.base import AttemptOutcome
from orchestrator.learner import LOSSES
from orchestrator.sim.model import matmul_rounded
from orchestrator.sim.precision import TrainerOps

MISMATCH = (M.K1_KL, M.K3_KL, M.CHI2_TOKEN, M.TV, M.PROB_DIFF_MEAN)


def test_every_loss_trains_and_each_is_a_different_update(sim, tmp_path) -> None:
    # A large step and two epochs move the ratios off 1, where the losses part ways (at r = 1
    # cispo and dppo are the same REINFORCE term).
    final = {}
    for mode in LOSSES:
        over = {"correction.is_level": "token", "learner.loss": mode, "train.lr": 0.05,
                "train.ppo_epochs": 2}
        res, ctx = sim.run(tmp_path / mode, sim.pool("sim-a100"), 2, over)
        assert res.outcome is AttemptOutcome.COMPLETED, res
        assert all(torch.isfinite(torch.tensor(v)) for v in ctx.metrics[2].values())
        final[mode] = (ctx.metrics[2][M.PG_LOSS], ctx.metrics[2][M.GRAD_NORM])
    assert len(set(final.values())) == len(final), final


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_trainer_is_reproducible_and_creates_mismatch(sim, tmp_path, precision) -> None:
    """Against the deterministic (fp32) engine, an fp32 trainer has k3 = 0; a bf16/fp16 trainer
    computes pi_old in its own precision, so the mismatch is real and the same on every run."""
    over = {"rollout.deterministic": True, "learner.precision": precision}
    _, a = sim.run(tmp_path / "a", sim.pool("sim-h100"), 3, over)
    _, b = sim.run(tmp_path / "b", sim.pool("sim-h100"), 3, over)
    assert sim.no_timing(a.metrics) == sim.no_timing(b.metrics)
    assert all(m[M.K3_KL] > 0 for m in a.metrics.values())
    _, f = sim.run(tmp_path / "f", sim.pool("sim-h100"), 3, {**over, "learner.precision": "fp32"})
    assert all(m[M.K3_KL] == 0.0 for m in f.metrics.values())
    if precision == "fp16":
        assert a.metrics[3][M.LOSS_SCALE] == 2.0**16 and a.metrics[3][M.SKIPPED_SHARE] == 0.0


def test_fp16_resume_is_bit_for_bit(sim, tmp_path) -> None:
    over = {"learner.precision": "fp16", "learner.loss": "cispo"}
    _, full = sim.run(tmp_path / "full", sim.pool("sim-h100"), 4, over)
    _, first = sim.run(tmp_path / "r", sim.pool("sim-h100"), 2, over, every=2)
    _, rest = sim.run(tmp_path / "r", sim.pool("sim-h100"), 4, over, every=2, resume=2)
    assert sim.no_timing(full.metrics)[2] == sim.no_timing(first.metrics)[2]
    assert sim.no_timing(full.metrics)[4] == sim.no_timing(rest.metrics)[4]


def test_true_on_policy_k3_is_zero_every_step_and_samples_differ(sim, tmp_path) -> None:
    res, ctx = sim.run(tmp_path, sim.pool("sim-a100"), 4, {"learner.preset": "true_on_policy"})
    assert res.outcome is AttemptOutcome.COMPLETED
    for m in ctx.metrics.values():
        assert all(m[k] == 0.0 for k in MISMATCH), {k: m[k] for k in MISMATCH}
    # the n samples of each prompt are drawn from the same policy but not the same tokens
    from orchestrator.sim.config import build_setup
    from orchestrator.sim.model import ModelConfig
    from orchestrator.sim.task import Task
    from orchestrator.sim.trainer import GRPOTrainer, TrainConfig

    setup = build_setup(sim.config({"learner.preset": "true_on_policy"}), sim.pool("sim-a100"))
    assert setup.rollout.deterministic and setup.numerics.deterministic
    task = Task(**setup.task)
    tr = GRPOTrainer(ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model), task,
                     TrainConfig(**setup.train), setup.correction, setup.numerics, 0, setup.learner)
    prompts = task.prompts(4, torch.Generator().manual_seed(0)).repeat_interleave(4, 0)
    ro = tr.engine.generate(prompts, torch.Generator().manual_seed(1))
    for g in ro.responses.view(4, 4, -1):
        assert len({tuple(r.tolist()) for r in g}) > 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_trainer_gemm_is_the_rounded_kernel(dtype) -> None:
    """The trainer's explicit GEMM = an fp32 GEMM over rounded operands, output rounded: the
    rollout engine's documented arithmetic (tests/sim/test_engine_arithmetic.py)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 32, generator=g), torch.randn(16, 32, generator=g)
    ops = TrainerOps("bf16" if dtype == torch.bfloat16 else "fp16")
    out = ops.linear(x, {"w": w}, "w")
    assert out.dtype == torch.float32
    assert torch.equal(out, matmul_rounded(x.to(dtype), w.to(dtype).T).float())


@pytest.mark.parametrize(("over", "needle"), [
    ({"learner.loss": "gspo", "correction.policy": "bypass"}, "bypass mode replaces the policy loss"),
    ({"learner.max_staleness": 2}, "rollout.weight_lag: 2"),
    ({"learner.preset": "true_on_policy", "learner.precision": "bf16"}, "learner.precision: fp32"),
    # Every key the preset fixes, not only some: a lag or async staleness breaks k3 = 0.
    ({"learner.preset": "true_on_policy", "rollout.weight_lag": 3},
     "with rollout.weight_lag: 3: the preset needs rollout.weight_lag: 0"),
    ({"learner.preset": "true_on_policy", "learner.max_staleness": 2},
     "with learner.max_staleness: 2: the preset needs unset"),
    ({"learner.preset": "true_on_policy", "rollout.deterministic": False},
     "the preset needs rollout.deterministic: true"),
    ({"learner.deterministic": True, "sim.reproducible": False}, "sim.reproducible: true"),
])
def test_refused_before_any_work(sim, tmp_path, over, needle) -> None:
    from orchestrator.exceptions import UserError

    with pytest.raises(UserError, match=needle.replace(".", r"\.")):
        sim.run(tmp_path, sim.pool("sim-h100"), 1, over)


def _fp16_trainer(sim):
    from orchestrator.sim.config import build_setup
    from orchestrator.sim.model import ModelConfig
    from orchestrator.sim.task import Task
    from orchestrator.sim.trainer import GRPOTrainer, TrainConfig

    setup = build_setup(sim.config({"learner.precision": "fp16", "eval.every": 100}),
                        sim.pool("sim-a100"))
    task = Task(**setup.task)
    return GRPOTrainer(ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model), task,
                       TrainConfig(**setup.train), setup.correction, setup.numerics, 0, setup.learner)


def test_sim_fp16_counts_skipped_updates_and_logs_the_grad_norm_as_verl(sim) -> None:
    """A scale far too large overflows: the updates are skipped (weights unchanged), counted,
    the grad norm logged non-finite (as verl logs it), the scale halves per skip until updates
    go through, and the verdict reads the burst as routine, not a numeric failure."""
    import math

    from orchestrator.schema import CollapseSpec
    from orchestrator.verdict import VerdictKind, judge

    tr = _fp16_trainer(sim)
    tr.scaler.scale = 2.0**30  # overflows down to ~2^19 on this model
    before = {k: v.detach().clone() for k, v in tr.params.items()}
    first = tr.step(1)
    assert first[M.SKIPPED_SHARE] == 1.0 and not math.isfinite(first[M.GRAD_NORM])
    assert all(torch.equal(before[k], v) for k, v in tr.params.items())
    assert first[M.LOSS_SCALE] == (2.0**29 + 2.0**28) / 2  # mean over 2 mini-batches, each halving
    history = [(1, first)] + [(s, tr.step(s)) for s in range(2, 13)]
    shares = [row[M.SKIPPED_SHARE] for _, row in history]
    assert shares[-1] == 0.0 and math.isfinite(history[-1][1][M.GRAD_NORM])
    assert 0 < sum(shares) < len(shares)
    v = judge(history, CollapseSpec())
    assert v.kind is not VerdictKind.NUMERIC_FAILURE and v.rule != "fp16_skipped_updates", v
