"""The simulator's corrections and verl 0.9.1's, spec by spec, over the whole matrix.

Allowed specs: weights, loss mask and denominator mask equal verl's (rtol 1e-5, masks exact) on
generated batches (``tests/correction_parity.py``). Refused specs: verl cannot express each one
or computes something else, shown on the same batches. Holes in the bounds are refused at plan
time, and an update with nothing to train on fails the attempt.
"""
from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl")

import correction_parity as P
from pydantic import ValidationError

from orchestrator import corrections
from orchestrator.corrections import CorrectionSpec
from orchestrator.sim import correction_math
from orchestrator.verl import mapping


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    # Thousands of tiny kernels: a second intra-op thread only waits for a shared core.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def matrix() -> P.Classified:
    return P.classify()


@pytest.fixture(scope="module")
def mixed() -> list[P.Batch]:
    return P.mixed_batches(0)


def _helper() -> Callable[..., Any]:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    return compute_rollout_correction_and_rejection_mask


# --------------------------------------------------------------------------- allowed: parity


def test_every_allowed_spec_computes_what_verl_computes(matrix: P.Classified,
                                                        mixed: list[P.Batch]) -> None:
    assert matrix.raw == 120_960 and len(matrix.allowed) >= 5_000
    report = P.run(matrix.allowed, mixed)
    assert report.cases == 2 * len(matrix.allowed)
    shown = [f"{spec} on {batch}: {', '.join(what)}" for spec, batch, what in
             report.disagreements[:8]]
    assert not report.disagreements, (
        f"{len(report.disagreements)} of {report.cases} cases disagree; by object "
        f"{dict(report.by('what'))}; first: " + " | ".join(shown))


def test_the_comparison_is_not_vacuous(matrix: P.Classified, mixed: list[P.Batch]) -> None:
    """The batches hold what the matrix must be tested on, and every rule bites on them."""
    fp32 = mixed[0]
    valid = fp32.mask != 0
    lr = (fp32.old - fp32.mu)[valid]
    assert (lr.abs() == 20).any() and (lr.abs() > 20).any()  # log-ratios at and beyond +-20
    pad_old, pad_mu = fp32.old[~valid], fp32.mu[~valid]
    assert pad_old.isnan().any() and (pad_mu == -math.inf).any() and pad_old.isinf().any()
    assert (fp32.mask.sum(-1) == 0).sum() >= 3  # all-masked rows
    holes = (fp32.mask[:, 1:] > fp32.mask[:, :-1]).any(-1)  # a 0 -> 1 step inside a response
    assert holes.sum() >= 6
    assert fp32.mu.dtype == torch.float32 and mixed[1].mu.dtype == torch.bfloat16
    bitten: dict[str, int] = {}
    for key, spec in matrix.allowed.items():
        corr = correction_math.apply_correction(fp32.old, fp32.mu, fp32.mask, spec)
        rejected = bool((corr.loss_mask != fp32.mask).any())
        for opt, _ in corrections.rejection_rules(spec):
            bitten[opt] = bitten.get(opt, 0) + rejected
        if corr.weights is not None:
            raw = torch.exp((fp32.old - fp32.mu).clamp(-20, 20))
            assert not torch.equal(corr.weights[valid], raw[valid]), key
    assert set(bitten) == set(corrections.RS_FILTER_OPTIONS) and min(bitten.values()) > 0


def test_the_matrix_is_enumerated_from_the_vocabulary(matrix: P.Classified) -> None:
    allowed = list(matrix.allowed.values())
    for field in ("is_level", "is_mode", "rs", "policy", "loss_type", "denominator"):
        seen = {getattr(s, field) for s in allowed} | {
            getattr(s, field) for s, _ in matrix.refused.values()}
        assert seen == set(P._literals(field)), field
    assert {s.batch_norm for s in allowed} == {False, True}
    assert {o for s in allowed for o in s.rs_filters} == set(corrections.RS_FILTER_OPTIONS)
    assert all(s.veto is None for s in allowed)  # every vetoing spec is refused


# --------------------------------------------------------------------------- refused


def _valid(b: P.Batch) -> torch.Tensor:
    return b.mask != 0


def _raises(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except (ValueError, TypeError):
        return True
    return False


def _geometric_is(spec: CorrectionSpec, b: P.Batch) -> bool:
    """verl has no geometric weights: the helper refuses the level, and its nearest level
    (sequence) weighs differently."""
    helper = _helper()
    cannot = _raises(lambda: helper(b.old, b.mu, b.mask, rollout_is="geometric",
                                    rollout_is_threshold=spec.is_hi))
    nearest = spec.model_copy(update={"is_level": "sequence", "is_mode": "truncate"})
    s = mapping.correction_settings(nearest)
    proto, _, _ = helper(b.old, b.mu, b.mask, rollout_is="sequence",
                         rollout_is_threshold=s["rollout_is_threshold"],
                         rollout_is_batch_normalize=s["rollout_is_batch_normalize"])
    ours = correction_math.is_weights(b.old - b.mu, b.mask, spec)[0]
    return cannot and not torch.allclose(ours[_valid(b)], proto.batch["rollout_is_weights"][_valid(b)])


def _clip_mode(spec: CorrectionSpec, b: P.Batch) -> bool:
    """No lower clamp in verl: both nearest settings (TIS cap, IcePop band) weigh differently."""
    ours = correction_math.is_weights(b.old - b.mu, b.mask, spec)[0][_valid(b)]
    for mode in ("truncate", "mask"):
        s = mapping.correction_settings(spec.model_copy(update={"is_mode": mode}))
        proto, _, _ = _helper()(b.old, b.mu, b.mask, rollout_is=s["rollout_is"],
                                rollout_is_threshold=s["rollout_is_threshold"],
                                rollout_is_batch_normalize=s["rollout_is_batch_normalize"])
        if torch.allclose(ours, proto.batch["rollout_is_weights"][_valid(b)]):
            return False
    return True


def _veto(spec: CorrectionSpec, b: P.Batch) -> bool:
    """verl 0.9.1 has no veto key (helper and config), and the nearest filter (seq_max_k2, both
    sides of the ratio) rejects other sequences than the veto (low side only)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    names = set(inspect.signature(_helper()).parameters) | set(
        RolloutCorrectionConfig.__dataclass_fields__)
    if any("veto" in n for n in names):
        return False
    k2 = 0.5 * math.log(spec.veto) ** 2  # the nearest setting the refusal names
    _, theirs, _ = _helper()(b.old, b.mu, b.mask, rollout_rs="seq_max_k2", rollout_rs_threshold=k2)
    ours = correction_math.rejection_mask(b.old - b.mu, b.mask, CorrectionSpec(veto=spec.veto))[0]
    return not torch.equal(ours, theirs)


def _denominator(spec: CorrectionSpec, b: P.Batch) -> bool:
    """Some token is rejected on the batch, so the denominator verl counts (the survivors in
    decoupled mode, every token in bypass mode: see the module docstring of correction_parity
    and the bypass-loss test below) is not the one this spec asks for."""
    s = mapping.correction_settings(spec)
    _, rs_mask, _ = _helper()(b.old, b.mu, b.mask, rollout_rs=s["rollout_rs"],
                              rollout_rs_threshold=s["rollout_rs_threshold"])
    theirs = b.mask if spec.policy == "bypass" else rs_mask
    ours = rs_mask if spec.denominator == "renormalized" else b.mask
    return not torch.equal(theirs, ours)


def _duplicate_option(spec: CorrectionSpec, b: P.Batch) -> bool:
    """verl takes each rejection option once: two thresholds for one option are an error."""
    s = mapping.correction_settings(spec)
    opts = s["rollout_rs"].split(",")
    assert len(opts) != len(set(opts))
    return _raises(lambda: _helper()(b.old, b.mu, b.mask, rollout_rs=s["rollout_rs"],
                                     rollout_rs_threshold=s["rollout_rs_threshold"]))


def _advantages(b: P.Batch) -> torch.Tensor:
    # Positive: verl's dual-clip (ratio > 3 with A < 0) is a policy-loss matter, not this one.
    g = torch.Generator().manual_seed(1)
    return (torch.rand(b.old.shape[0], 1, generator=g) + 0.1).expand_as(b.old).contiguous()


def _verl_bypass_loss(spec: CorrectionSpec, b: P.Batch) -> float:
    """verl's bypass loss, given what its engine gives it: ``batch_num_tokens`` counted on the
    mini-batch's response mask before the loss (workers/utils/losses.py ``ppo_loss``)."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    rc = RolloutCorrectionConfig(**mapping.correction_settings(spec))
    actor = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                        policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rc),
                        global_batch_info={"dp_size": 1, "batch_num_tokens": int(b.mask.sum()),
                                           "global_batch_size": None, "loss_scale_factor": None})
    loss, _ = get_policy_loss_fn("bypass_mode")(
        old_log_prob=b.mu, log_prob=b.old, advantages=_advantages(b), response_mask=b.mask.bool(),
        loss_agg_mode="token-mean", config=actor)
    return float(loss)


def _sim_loss(spec: CorrectionSpec, b: P.Batch) -> float:
    corr = correction_math.apply_correction(b.old, b.mu, b.mask, spec)  # bypass: old plays pi_theta
    loss, _ = correction_math.policy_loss(b.old, b.mu, _advantages(b), corr, spec, clip_eps=0.2)
    return float(loss)


DEMONSTRATIONS: dict[str, tuple[Callable[[CorrectionSpec, P.Batch], bool], tuple[str, ...]]] = {
    # rule -> (demonstration, the fields it depends on: one run per distinct projection)
    "geometric_is": (_geometric_is, ("is_bounds", "batch_norm")),
    "clip_mode": (_clip_mode, ("is_level", "is_bounds", "batch_norm")),
    "veto": (_veto, ("veto",)),
    "denominator": (_denominator, ("is_bounds", "rs", "rs_bounds", "rs_filters", "denominator",
                                   "policy")),
    "duplicate_option": (_duplicate_option, ("rs", "rs_bounds", "is_bounds", "rs_filters")),
}


def test_every_refused_spec_is_one_verl_cannot_express_or_computes_differently(
        matrix: P.Classified, mixed: list[P.Batch]) -> None:
    fp32 = mixed[0]
    shown: dict[tuple[str, str], bool] = {}
    by_rule: dict[str, int] = {}
    for key, (spec, message) in matrix.refused.items():
        rule, reason = mapping.correction_refusal(spec)  # type: ignore[misc]
        assert reason == message and "\n" not in reason
        assert "fix:" in reason or "nearest:" in reason
        demo, fields = DEMONSTRATIONS[rule]
        projection = (rule, json.dumps({f: spec.non_default().get(f) for f in fields},
                                       sort_keys=True))
        if projection not in shown:
            shown[projection] = demo(spec, fp32)
        assert shown[projection], f"{key}: refused as {rule!r} but verl computes the same"
        by_rule[rule] = by_rule.get(rule, 0) + 1
    assert set(by_rule) == set(DEMONSTRATIONS) and len(matrix.refused) >= 40_000


def test_bypass_loss_with_rejection_matches_verl_with_the_original_denominator(
        mixed: list[P.Batch]) -> None:
    """verl's own bypass loss, fed as its engine feeds it, equals the simulator's loss with
    ``denominator: original`` and not with ``renormalized``."""
    fp32 = mixed[0]
    for raw in ({"rs": "token", "rs_bounds": [0.4, 2.5]}, {"rs": "geometric", "rs_bounds": [0.9, 1.15]},
                {"is_level": "token", "rs_filters": {"seq_max_k2": 0.3}},
                {"is_level": "sequence", "is_mode": "mask", "is_bounds": [0.5, 3.0],
                 "batch_norm": True, "rs": "sequence", "rs_bounds": [0.25, 3.0]}):
        for loss_type in ("reinforce", "ppo_clip"):
            spec = CorrectionSpec(**raw, policy="bypass", loss_type=loss_type, denominator="original")
            assert mapping.check_correction(spec) is None
            theirs = _verl_bypass_loss(spec, fp32)
            assert _sim_loss(spec, fp32) == pytest.approx(theirs, rel=1e-5)
            renormalized = spec.model_copy(update={"denominator": "renormalized"})
            assert _sim_loss(renormalized, fp32) != pytest.approx(theirs, rel=1e-3)


# --------------------------------------------------------------------------- holes, empty


@pytest.mark.parametrize("raw,key,effect", [
    ({"is_level": "token", "is_mode": "mask", "is_bounds": [None, 0.5]}, "correction.is_bounds",
     "zero every weight"),
    ({"rs": "token", "is_bounds": [None, 0.5]}, "correction.is_bounds", "reject every token"),
    ({"rs": "geometric", "rs_bounds": [None, 0.5]}, "correction.rs_bounds", "reject every token"),
    ({"rs_filters": {"seq_sum_k1": 0.5}}, "correction.rs_filters.seq_sum_k1", "every token"),
])
def test_an_empty_band_is_refused_at_plan_time_and_verl_refuses_it_too(
        raw: dict[str, Any], key: str, effect: str) -> None:
    with pytest.raises(ValidationError) as err:
        CorrectionSpec(**raw)
    msg = err.value.errors()[0]["msg"]
    assert key in msg and "implied lower bound 1/0.5 = 2" in msg and effect in msg
    assert "fix:" in msg and "\n" not in msg
    b = P.make_batch("plain", torch.float32)
    assert _raises(lambda: _helper()(b.old, b.mu, b.mask, rollout_is="token",
                                     rollout_is_threshold="2_0.5"))
    assert _raises(lambda: _helper()(b.old, b.mu, b.mask, rollout_rs="seq_sum_k1",
                                     rollout_rs_threshold="0.5"))
    # Truncation only uses the upper bound: [null, 0.5] is a valid cap there.
    assert CorrectionSpec(is_level="token", is_bounds=[None, 0.5]).is_hi == 0.5


def test_an_empty_band_in_a_grid_is_one_line_naming_the_key_and_the_fix(tmp_path: Path) -> None:
    from orchestrator.exceptions import GridError
    from orchestrator.grid import expand, load_grid

    grid = tmp_path / "g.yaml"
    grid.write_text("name: hole\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 3\npool: sim-h100\n"
                    "axes:\n  correction.is_mode: [truncate, mask]\n"
                    "overrides:\n  correction.is_level: token\n  correction.is_bounds: [null, 0.5]\n")
    with pytest.raises(GridError) as err:
        expand(load_grid(grid))
    msg = str(err.value)
    assert msg.startswith(f"{grid}:") and "correction.is_mode=mask" in msg and "\n" not in msg
    assert "correction.is_bounds [null, 0.5]: the implied lower bound 1/0.5 = 2" in msg
    assert msg.count("fix:") == 1 and "[lo, 0.5] with lo <= 0.5" in msg


def test_an_empty_batch_is_an_error_in_verl_and_a_numeric_failure_in_the_simulator() -> None:
    b = P.make_batch("plain", torch.float32)
    empty = torch.zeros_like(b.mask)
    with pytest.raises(ValueError, match="at least one valid token"):
        _helper()(b.old, b.mu, empty)
    assert "no response token" in correction_math.empty_update(empty, empty)  # type: ignore[operator]
    spec = CorrectionSpec(rs="token", rs_bounds=[30.0, 40.0])  # rejects every token here
    corr = correction_math.apply_correction(b.old, b.mu, b.mask, spec)
    why = correction_math.empty_update(b.mask, corr.loss_mask)
    assert why and f"every one of the {int(b.mask.sum())} response tokens was rejected" in why
    assert correction_math.empty_update(b.mask, b.mask) is None


def test_the_simulator_fails_an_attempt_whose_update_has_nothing_to_train_on(tmp_path: Path) -> None:
    from orchestrator import recipes
    from orchestrator.engine import RolloutSpec
    from orchestrator.pools import load_catalog
    from orchestrator.sim.job import SimTrainer
    from orchestrator.sim.local import LocalContext, make_trial

    over = {"correction.rs_filters": {"token_k1": "5_10"},  # pi_rollout/pi_train in [5, 10]
            "train.prompts_per_step": 2, "train.group_size": 2, "train.minibatches": 1,
            "eval.every": 100}
    base = recipes.compose_recipe("sim/grpo_tiny", root=recipes.REPO_RECIPES)
    for section, model in (("correction", CorrectionSpec), ("rollout", RolloutSpec)):
        base[section] = {**model().model_dump(mode="json"), **(base.get(section) or {})}
    pool = load_catalog().get("sim-h100")
    trial = make_trial(pool.name, 3, 0, over)
    ctx = LocalContext(trial=trial, pool=pool, workdir=tmp_path)
    result = SimTrainer().run(trial, recipes.apply_overrides(base, over), ctx)
    assert result.outcome.value == "numeric_failure" and result.last_step == 0
    assert "step 1" in result.reason and "nothing to train on" in result.reason
    assert not ctx.metrics  # no step was logged as if it had trained
