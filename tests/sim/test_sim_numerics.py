"""The rollout engine's arithmetic: per-pool mismatch inside its documented range, and the
knobs each move the mismatch the way the README says (no noise anywhere: fp32 is ~exact)."""
from __future__ import annotations

import pytest

from orchestrator.engine import RolloutSpec
from orchestrator.sim.calibrate import measure_k3, reference_policy

# k3 KL on the reference policy (the recipe trained with an fp32 engine until its entropy is
# 1.5 nats, seed 0), as documented in orchestrator/sim/README.md. Where the seeds give a range
# the bound is the seeds' range; the exceptions are written out (measured values in comments).
RANGES = {
    "dense": {
        "sim-h20": (0.0, 1e-6),  # 1.3e-8: "much lower" than H100
        "sim-h100": (1e-5, 1e-3),  # 1.7e-5: seeds' dense range
        "sim-l20": (1e-5, 1e-3),  # 3.1e-5
        # 5.4e-3 on this reference (the 300-step trial's learning-phase median is 2.6e-2):
        # the seeds' 1e-2..1 holds for the trial, the reference sits 2x below it.
        "sim-a100": (3e-3, 1.0),
    },
    "moe": {
        "sim-h20": (0.0, 1e-5),  # 3.6e-7
        # 3.7e-4 (7.4e-4 as the median of seeds 0-2's references), about 20x dense: below the
        # seeds' 1e-3..1e-1 (README: why), so the bound is the measured value / 3 -- it fails if
        # the router flips stop mattering.
        "sim-h100": (1.2e-4, 1e-1),
        "sim-l20": (1.2e-4, 1e-1),  # 4.6e-4
        "sim-a100": (1e-2, 1.0),  # 1.4e-2: seeds' A100 range
    },
}


@pytest.fixture(scope="module", params=["dense", pytest.param("moe", marks=pytest.mark.slow)])
def reference(request, sim):
    arch = request.param
    cfg = sim.config({"model.arch": arch, "train.prompts_per_step": 16, "train.group_size": 8,
                      "train.minibatches": 4})
    return arch, reference_policy(cfg, sim.pool("sim-h100"), entropy=1.5)


def test_k3_per_pool_inside_documented_range(sim, reference) -> None:
    arch, ref = reference
    assert 1.0 < ref.entropy <= 1.5 and ref.steps < 300  # a policy in its learning phase
    measured = {name: measure_k3(ref, sim.pool(name)) for name in RANGES[arch]}
    for name, (lo, hi) in RANGES[arch].items():
        assert lo <= measured[name] <= hi, (arch, name, f"{measured[name]:.2e}", measured)
    # The seeds' ordering: H20 much lower than H100, A100 the worst.
    assert measured["sim-h20"] * 100 < measured["sim-h100"] <= measured["sim-l20"] * 1.5
    assert max(measured["sim-h100"], measured["sim-l20"]) * 10 < measured["sim-a100"]


def test_each_knob_moves_mismatch_the_documented_way(sim, reference) -> None:
    arch, ref = reference
    h100 = sim.pool("sim-h100")
    fp32 = sim.pool("sim-h100", dtype="fp32", lm_head="fp32", kv_cache="fp32",
                    reduction_order="default")
    base = measure_k3(ref, h100)
    assert measure_k3(ref, fp32) < 1e-10  # fp32 with a KV cache: rounding noise only
    assert measure_k3(ref, h100, rollout=RolloutSpec(deterministic=True)) == 0.0
    fp16 = RolloutSpec(dtype="fp16", lm_head_fp32=True, kv_cache_dtype="fp16",
                       reduction_order="default")
    assert measure_k3(ref, h100, rollout=fp16) < base / 5  # the flags override the pool
    assert measure_k3(ref, sim.pool("sim-h100", weight_quant="int4")) > 1.5 * base
    assert measure_k3(ref, h100, rollout=RolloutSpec(weight_lag=1)) > 10 * base
    if arch == "moe":  # bf16-rounded routing probabilities make most of the MoE mismatch
        assert measure_k3(ref, sim.pool("sim-h100", router="fp32")) < base / 3
