"""Correction math: against verl's own helper where verl has the configuration, by hand elsewhere."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator import metrics as M
from orchestrator.corrections import CorrectionSpec
from orchestrator.sim.correction_math import (
    apply_correction,
    is_weights,
    mismatch_metrics,
    opsm_mask,
    policy_loss,
    rejection_mask,
)


def _batch(seed: int, b: int = 16, r: int = 12, scale: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    mu = -torch.rand(b, r, generator=g, dtype=torch.float64) * 3
    old = mu + torch.randn(b, r, generator=g, dtype=torch.float64) * scale
    lengths = torch.randint(1, r + 1, (b,), generator=g)
    mask = (torch.arange(r)[None] < lengths[:, None]).double()
    return old, mu, mask


# --------------------------------------------------------------------------- against verl
verl_helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")

VERL_CASES = [
    # (our spec, verl kwargs)
    ({"is_level": "token", "is_mode": "truncate", "is_bounds": [None, 2.0]},
     {"rollout_is": "token", "rollout_is_threshold": 2.0}),
    ({"is_level": "sequence", "is_mode": "truncate", "is_bounds": [None, 5.0]},
     {"rollout_is": "sequence", "rollout_is_threshold": 5.0}),
    ({"is_level": "token", "is_mode": "mask", "is_bounds": [0.5, 5.0]},  # IcePop
     {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}),
    ({"is_level": "sequence", "is_mode": "mask", "is_bounds": [0.5, 2.0]},
     {"rollout_is": "sequence", "rollout_is_threshold": "0.5_2.0"}),
    ({"is_level": "token", "is_mode": "truncate", "is_bounds": [None, 2.0], "batch_norm": True},
     {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True}),
    ({"is_level": "sequence", "is_mode": "truncate", "is_bounds": [None, 3.0], "batch_norm": True},
     {"rollout_is": "sequence", "rollout_is_threshold": 3.0, "rollout_is_batch_normalize": True}),
    ({"rs_filters": {"token_k1": "0.5_2.0"}}, {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}),
    ({"rs_filters": {"token_k2": 0.1}}, {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.1}),
    ({"rs_filters": {"token_k3": 0.05}}, {"rollout_rs": "token_k3", "rollout_rs_threshold": 0.05}),
    ({"rs_filters": {"seq_sum_k1": "0.3_3.0"}}, {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.3_3.0"}),
    ({"rs_filters": {"seq_mean_k1": "0.9_1.1"}}, {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.9_1.1"}),
    ({"rs_filters": {"seq_sum_k3": 0.5}}, {"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": 0.5}),
    ({"rs_filters": {"seq_mean_k3": 0.01}}, {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01}),
    ({"rs_filters": {"seq_mean_k2": 0.05}}, {"rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 0.05}),
    ({"rs_filters": {"seq_max_k2": 0.3}}, {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": 0.3}),
    ({"rs_filters": {"seq_max_k3": 0.2}}, {"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 0.2}),
    ({"is_level": "token", "is_mode": "truncate", "is_bounds": [None, 2.0],
          "rs_filters": {"token_k1": "0.5_2.0", "seq_max_k3": 0.3}},
     {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1,seq_max_k3",
          "rollout_rs_threshold": "0.5_2.0,0.3"}),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("ours,theirs", VERL_CASES, ids=[str(c[1]) for c in VERL_CASES])
def test_weights_and_masks_match_verl(ours: dict, theirs: dict, seed: int) -> None:
    old, mu, mask = _batch(seed)
    spec = CorrectionSpec(**ours)
    corr = apply_correction(old, mu, mask, spec)
    proto, verl_mask, verl_metrics = verl_helper.compute_rollout_correction_and_rejection_mask(
        old, mu, mask, **theirs)
    torch.testing.assert_close(corr.loss_mask, verl_mask.to(corr.loss_mask.dtype), rtol=0, atol=0)
    if proto is not None:
        torch.testing.assert_close(corr.weights, proto.batch["rollout_is_weights"],
                                   rtol=1e-8, atol=1e-12)  # verl: +1e-8 in BN mean
    # The shared off-policy diagnostics agree with verl's too.
    ours_m = mismatch_metrics(old, mu, mask)
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "training_ppl"):
        key = f"rollout_corr/{name}"
        # verl adds 1e-8 to masked-mean denominators, hence the relative tolerance.
        assert ours_m[key] == pytest.approx(verl_metrics[key], rel=1e-6, abs=1e-12), name


def test_verl_cases_actually_reject_something() -> None:
    """Guard against a vacuous comparison: the filters bite on these inputs."""
    old, mu, mask = _batch(0)
    bitten = 0
    for ours, _ in VERL_CASES:
        corr = apply_correction(old, mu, mask, CorrectionSpec(**ours))
        w = corr.weights
        bitten += bool(corr.loss_mask.sum() < mask.sum()) or bool(
            w is not None and not torch.equal(w, torch.exp(old - mu) * mask))
    assert bitten == len(VERL_CASES)


# --------------------------------------------------------------------------- by hand
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
LR = torch.tensor([[0.2, -0.4, 0.8, 9.0], [math.log(3.0), 0.1, 5.0, 5.0]], dtype=torch.float64)


def test_geometric_is_is_exp_of_mean_log_ratio() -> None:
    spec = CorrectionSpec(is_level="geometric", is_mode="truncate", is_bounds=[None, 10.0])
    w, _, _ = is_weights(LR, MASK, spec)
    e0, e1 = math.exp((0.2 - 0.4 + 0.8) / 3), math.exp((math.log(3.0) + 0.1) / 2)
    expected = torch.tensor([[e0, e0, e0, 0.0], [e1, e1, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(w, expected)


def test_clip_mode_clamps_both_sides() -> None:
    spec = CorrectionSpec(is_level="token", is_mode="clip", is_bounds=[0.8, 1.5])
    w, _, _ = is_weights(LR, MASK, spec)
    expected = torch.tensor([[math.exp(0.2), 0.8, 1.5, 0.0], [1.5, math.exp(0.1), 0.0, 0.0]],
                            dtype=torch.float64)
    torch.testing.assert_close(w, expected)


def test_mask_mode_zeroes_out_of_band_weights_only() -> None:
    spec = CorrectionSpec(is_level="token", is_mode="mask", is_bounds=[0.8, 1.5])
    corr = apply_correction(LR, torch.zeros_like(LR), MASK, spec)
    expected = torch.tensor([[math.exp(0.2), 0.0, 0.0, 0.0], [0.0, math.exp(0.1), 0.0, 0.0]],
                            dtype=torch.float64)
    torch.testing.assert_close(corr.weights, expected)
    torch.testing.assert_close(corr.loss_mask, MASK)  # IS masking leaves the loss mask alone
    assert corr.metrics["is_masked"] == pytest.approx(3 / 5)


def test_veto_rejects_whole_sequence_on_one_catastrophic_token() -> None:
    lr = torch.tensor([[0.0, math.log(1e-5), 0.0], [0.0, math.log(1e-3), 0.0]], dtype=torch.float64)
    mask = torch.ones_like(lr)
    out, metrics = rejection_mask(lr, mask, CorrectionSpec(veto=1e-4))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0, 0], [1, 1, 1]], dtype=torch.float64))
    assert metrics["vetoed"] == 0.5
    # A catastrophic token in the padding does not count.
    out, _ = rejection_mask(lr, torch.tensor([[1.0, 0, 0], [1, 1, 1]], dtype=torch.float64),
                            CorrectionSpec(veto=1e-4))
    assert out[0, 0] == 1.0


def test_batch_norm_token_and_sequence_by_hand() -> None:
    w_tok, _, m = is_weights(LR, MASK, CorrectionSpec(is_level="token", is_bounds=[None, 2.0],
                                                      batch_norm=True))
    raw = [math.exp(0.2), math.exp(-0.4), 2.0, 2.0, math.exp(0.1)]
    mean = sum(raw) / 5
    assert m["batch_norm_factor"] == pytest.approx(mean)
    assert w_tok[0, 0].item() == pytest.approx(math.exp(0.2) / mean)
    assert (w_tok * MASK).sum().item() / 5 == pytest.approx(1.0)
    w_seq, _, m = is_weights(LR, MASK, CorrectionSpec(is_level="sequence", is_bounds=[None, 100.0],
                                                      batch_norm=True))
    s0, s1 = math.exp(0.6), math.exp(math.log(3.0) + 0.1)
    assert m["batch_norm_factor"] == pytest.approx((s0 + s1) / 2)  # mean over sequences
    assert w_seq[1, 0].item() == pytest.approx(s1 / ((s0 + s1) / 2))


def test_rs_levels_reject_tokens_or_sequences() -> None:
    spec = CorrectionSpec(rs="token", rs_bounds=[0.8, 1.5])
    out, _ = rejection_mask(LR, MASK, spec)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64))
    out, _ = rejection_mask(LR, MASK, CorrectionSpec(rs="geometric", rs_bounds=[0.5, 1.5]))
    # geometric ratios: exp(0.2)=1.22 kept; exp((ln3+0.1)/2)=1.82 rejected
    torch.testing.assert_close(out, torch.tensor([[1.0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.float64))


def test_denominator_original_vs_renormalized() -> None:
    """Miles keeps rejected tokens in the denominator; verl renormalises over survivors."""
    b, r = 2, 4
    logp = torch.zeros(b, r, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(b, r, dtype=torch.float64)
    lr = torch.zeros(b, r, dtype=torch.float64)
    lr[0, 0] = math.log(10.0)  # one token far outside the RS band
    losses = {}
    for denom in ("original", "renormalized"):
        spec = CorrectionSpec(rs="token", rs_bounds=[0.5, 2.0], denominator=denom)
        corr = apply_correction(lr, torch.zeros_like(lr), mask, spec)
        loss, _ = policy_loss(logp, logp.detach(), adv, corr, spec, clip_eps=0.2)
        losses[denom] = loss.item()
    # ratio 1 everywhere -> per-token loss -1; 7 tokens survive out of 8.
    assert losses["original"] == pytest.approx(-7 / 8)
    assert losses["renormalized"] == pytest.approx(-1.0)


def test_bypass_ppo_clip_does_not_apply_weights_but_reinforce_does() -> None:
    old, mu, mask = _batch(3)
    spec = CorrectionSpec(is_level="token", is_bounds=[None, 2.0], policy="bypass")
    assert apply_correction(old, mu, mask, spec).weights is None
    spec = CorrectionSpec(is_level="token", is_bounds=[None, 2.0], policy="bypass",
                          loss_type="reinforce")
    corr = apply_correction(old, mu, mask, spec)
    assert corr.weights is not None
    logp = old.clone().requires_grad_()
    adv = torch.ones(old.shape[0], dtype=torch.float64)
    loss, _ = policy_loss(logp, mu, adv, corr, spec, clip_eps=0.2)
    expected = -(corr.weights * old * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item())


def test_log_space_clamp_keeps_weights_finite() -> None:
    lr = torch.tensor([[80.0, -80.0]], dtype=torch.float64)
    mask = torch.ones_like(lr)
    _, raw, _ = is_weights(lr, mask, CorrectionSpec(is_level="sequence", is_mode="mask",
                                                    is_bounds=[0.5, 2.0]))
    assert torch.isfinite(raw).all() and raw[0, 0].item() == pytest.approx(1.0)  # sum is 0
    _, raw, _ = is_weights(lr, mask, CorrectionSpec(is_level="token", is_mode="mask"))
    assert raw[0, 0].item() == pytest.approx(math.exp(20.0))
    assert raw[0, 1].item() == pytest.approx(math.exp(-20.0))


def test_opsm_masks_only_negative_advantage_drifted_sequences() -> None:
    mu = torch.zeros(3, 2, dtype=torch.float64)
    theta = torch.tensor([[-0.1, -0.1], [-0.1, -0.1], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64)
    m = opsm_mask(theta, mu, torch.ones_like(mu), adv, delta=0.05)
    assert m.squeeze(-1).tolist() == [0.0, 1.0, 1.0]


def test_mismatch_metrics_by_hand_and_buckets() -> None:
    mu = torch.log(torch.tensor([[0.5, 0.0005]], dtype=torch.float64))
    old = mu + torch.tensor([[0.1, -1.0]], dtype=torch.float64)
    mask = torch.ones_like(mu)
    m = mismatch_metrics(old, mu, mask)
    k3 = [math.exp(0.1) - 0.1 - 1, math.exp(-1.0) + 1.0 - 1]
    assert m[M.K3_KL] == pytest.approx(sum(k3) / 2)
    assert m[M.K1_KL] == pytest.approx((-0.1 + 1.0) / 2)
    assert m[M.TV] == pytest.approx(0.5 * (abs(math.exp(0.1) - 1) + abs(math.exp(-1) - 1)) / 2)
    assert m[M.bucket_name(0.0, 1e-3)] == pytest.approx(k3[1])
    assert m[M.bucket_name(0.5, 0.7)] == pytest.approx(k3[0])
    assert M.bucket_name(0.1, 0.3) not in m  # empty bucket: no value
    assert m[M.bucket_count_name(0.1, 0.3)] == 0.0
