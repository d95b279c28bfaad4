"""``learner.loss`` on the simulator against verl 0.9.1's own ``core_algos`` policy losses.

Each mode's loss value, clip fraction and gradient with respect to pi_theta's log-probs equal
verl's (rtol 1e-6 in float64) on generated mini-batches: padded rows, an all-masked row, GRPO
advantages of both signs and zero, ratios far outside the clip range, and the IS weights and
RS loss mask of decoupled corrections computed by the simulator's correction math (which
``test_correction_parity.py`` checks against verl's helper).
"""
from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("verl")

from orchestrator.corrections import CorrectionSpec
from orchestrator.learner import LOSS_COMPANIONS, LOSSES
from orchestrator.sim import correction_math, loss_math

B, R, EPS = 12, 10, 0.2
CORRECTIONS = {
    "none": CorrectionSpec(),
    "token_tis": CorrectionSpec(is_level="token"),
    "seq_tis": CorrectionSpec(is_level="sequence", is_bounds=(None, 3.0)),
    "token_icepop": CorrectionSpec(is_level="token", is_mode="mask", is_bounds=(0.7, 1.4)),
    "seq_mis": CorrectionSpec(preset="decoupled_seq_is_rs"),
    "token_rs_bn": CorrectionSpec(is_level="token", rs="token", rs_bounds=(0.6, 1.6), batch_norm=True),
}


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, R, dtype=torch.float64)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask[torch.arange(R)[None, :] >= lengths[:, None]] = 0
    mask[2] = 0  # an empty response
    mu = torch.log(torch.rand(B, R, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    old = mu + 0.15 * torch.randn(B, R, generator=g, dtype=torch.float64)
    theta = old + 0.3 * torch.randn(B, R, generator=g, dtype=torch.float64)
    theta[0, :3] += 2.0  # ratios far beyond the clip range and the dual-clip cap
    theta[1, :3] -= 2.0
    old, theta = old.clamp(max=-1e-3), theta.clamp(max=-1e-3)  # log-probs of a real distribution
    adv = torch.randn(B // 4, generator=g, dtype=torch.float64).repeat_interleave(4)
    adv[4:8] = 0.0  # a group with equal rewards
    return {"mask": mask, "mu": mu, "old": old, "theta": theta, "adv": adv}


def _config(**settings):
    from verl.workers.config.actor import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1,
                           rollout_n=1, clip_ratio=EPS, **settings)


# Each mode at PPO's symmetric clip (verl's ActorConfig otherwise) and at its companions
# (learner.LOSS_COMPANIONS: verl's example settings for it), plus settings of every kind apart.
SETTINGS = {
    "ppo": {},
    "companions": None,  # LOSS_COMPANIONS[mode]
    "asymmetric": {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 5.0},
    "seq_mean": {"loss_agg_mode": "seq-mean-token-mean"},
}


def _settings(mode: str, name: str) -> dict:
    from orchestrator.learner import LOSS_READS

    chosen = LOSS_COMPANIONS.get(mode, {}) if SETTINGS[name] is None else SETTINGS[name]
    return {k: v for k, v in chosen.items() if k in LOSS_READS[mode]}


def _params(settings: dict) -> loss_math.LossParams:
    return loss_math.LossParams(settings.get("clip_ratio_low", EPS),
                                settings.get("clip_ratio_high", EPS),
                                settings.get("clip_ratio_c", loss_math.CLIP_RATIO_C),
                                settings.get("loss_agg_mode", "token-mean"))


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("corr", list(CORRECTIONS))
@pytest.mark.parametrize("mode", list(LOSSES))
def test_loss_matches_verl(mode: str, corr: str, setting: str) -> None:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    warnings.simplefilter("ignore")
    spec = CORRECTIONS[corr]
    settings = _settings(mode, setting)
    if setting != "ppo" and not settings:
        pytest.skip(f"{mode} reads none of these settings")
    for seed in range(3):
        b = _batch(seed)
        c = correction_math.apply_correction(b["old"], b["mu"], b["mask"], spec)
        adv_tok = b["adv"][:, None].expand(B, R)
        theta_v = b["theta"].clone().requires_grad_()
        loss_v, metrics = get_policy_loss_fn(mode)(
            old_log_prob=b["old"], log_prob=theta_v, advantages=adv_tok,
            response_mask=c.loss_mask, loss_agg_mode=settings.get("loss_agg_mode", "token-mean"),
            config=_config(**settings), rollout_is_weights=c.weights)
        loss_v.backward()
        theta_s = b["theta"].clone().requires_grad_()
        loss_s, clipfrac = loss_math.policy_loss(mode, theta_s, b["old"], b["adv"], c.loss_mask,
                                                 c.weights, c.denom_mask.sum(), _params(settings))
        loss_s.backward()
        assert torch.isfinite(loss_s)
        torch.testing.assert_close(loss_s, loss_v, rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(theta_s.grad, theta_v.grad, rtol=1e-6, atol=1e-12)
        assert clipfrac == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)


def test_losses_differ() -> None:
    """The modes are different losses on the same batch (a mapping to one verl key would not be)."""
    b = _batch(0)
    values = {m: loss_math.policy_loss(m, b["theta"], b["old"], b["adv"], b["mask"], None,
                                       b["mask"].sum(), EPS)[0].item() for m in LOSSES}
    assert len(set(values.values())) == len(LOSSES), values
