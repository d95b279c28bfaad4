"""The rollout engine's arithmetic: per-pool mismatch inside its documented range, and the
knobs each move the mismatch the way the README says (no noise anywhere: fp32 is ~exact).

The reference policy is trained here, under the pinned numerics (tests/conftest.py), so every
value below is the same on every x86-64 AVX2 machine (tests/sim/test_golden.py proves the
arithmetic is); the comments give the measured value and the bounds keep a stated margin.
`python -m orchestrator.sim.calibrate --knobs` prints them (seed 0 is this reference).
"""
from __future__ import annotations

import pytest

from orchestrator.engine import RolloutSpec
from orchestrator.sim.calibrate import measure_k3, reference_policy

# k3 KL on the reference policy (the recipe trained with an fp32 engine until its entropy is
# 1.5 nats, seed 0), as documented in orchestrator/sim/README.md. Where the seeds give a range
# the bound is the seeds' range; the exceptions are written out (measured values in comments).
RANGES = {
    "dense": {
        "sim-h20": (0.0, 1e-6),  # 1.2e-8: "much lower" than H100
        "sim-h100": (1e-5, 1e-3),  # 1.5e-5: seeds' dense range
        "sim-l20": (1e-5, 1e-3),  # 2.8e-5
        "sim-a100": (1e-2, 1.0),  # 1.7e-2: seeds' A100 range
    },
    "moe": {
        # 1.1e-5 on this reference (far lower on the seed-1/2 references, see the README): fp16
        # activations still flip a few near-tie routes; 41x below sim-h100 here.
        "sim-h20": (0.0, 5e-5),
        # 4.7e-4, about 30x dense: below the seeds' 1e-3..1e-1 (README: why), so the bound is
        # the measured value / 3.5 -- it fails if the router flips stop mattering.
        "sim-h100": (1.3e-4, 1e-1),
        "sim-l20": (1.2e-4, 1e-1),  # 4.0e-4
        "sim-a100": (1e-2, 1.0),  # 2.9e-2: seeds' A100 range
    },
}
# How far below sim-h100 sim-h20 sits (measured: dense 1260x, MoE 41x; bounds with 4x margin).
H20_BELOW_H100 = {"dense": 300, "moe": 10}
# int4 weights raise the mismatch (measured 2.45x dense, 1.18x MoE, where route flips dominate).
INT4_ABOVE = {"dense": 1.5, "moe": 1.05}


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
    assert measured["sim-h20"] * H20_BELOW_H100[arch] < measured["sim-h100"]
    assert measured["sim-h100"] <= measured["sim-l20"] * 1.5
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
    # Measured ratios to sim-h100 (dense / MoE): fp16 flags 8e-4 / 0.089, int4 2.45 / 1.18,
    # one step of weight lag 595 / 19, fp32 router (MoE) 0.35.
    assert measure_k3(ref, h100, rollout=fp16) < base / 5  # the flags override the pool
    assert measure_k3(ref, sim.pool("sim-h100", weight_quant="int4")) > INT4_ABOVE[arch] * base
    assert measure_k3(ref, h100, rollout=RolloutSpec(weight_lag=1)) > 10 * base
    if arch == "moe":  # bf16-rounded routing probabilities make most of the MoE mismatch
        assert measure_k3(ref, sim.pool("sim-h100", router="fp32")) < base / 2
