"""The rollout engine's arithmetic: per-pool mismatch inside its documented range, and the
knobs each move the mismatch the way the README says (no noise anywhere: fp32 is ~exact)."""
from __future__ import annotations

import pytest

from orchestrator.engine import RolloutSpec
from orchestrator.sim.calibrate import measure_k3, reference_policy

# Documented in orchestrator/sim/README.md (k3 KL on the reference policy: the recipe trained
# 80 steps with an fp32 engine, seed 0). Bounds are about 3x around what this machine measured.
RANGES = {
    "dense": {"sim-h20": (3e-9, 1e-6), "sim-h100": (3e-6, 1e-4), "sim-l20": (1e-5, 3e-4),
              "sim-a100": (5e-3, 1.0)},
    "moe": {"sim-h20": (1e-8, 1e-5), "sim-h100": (1e-5, 1e-3), "sim-l20": (3e-5, 3e-3),
            "sim-a100": (5e-3, 1.0)},
}
STEPS = 80


@pytest.fixture(scope="module", params=["dense", pytest.param("moe", marks=pytest.mark.slow)])
def reference(request, sim):
    arch = request.param
    cfg = sim.config({"model.arch": arch, "train.prompts_per_step": 16, "train.group_size": 8,
                      "train.minibatches": 4})
    return arch, reference_policy(cfg, sim.pool("sim-h100"), STEPS)


def test_k3_per_pool_inside_documented_range(sim, reference) -> None:
    arch, ref = reference
    measured = {name: measure_k3(ref, sim.pool(name)) for name in RANGES[arch]}
    for name, (lo, hi) in RANGES[arch].items():
        assert lo <= measured[name] <= hi, (arch, name, f"{measured[name]:.2e}", measured)
    # The seeds' ordering: H20 much lower than H100, A100 the worst.
    assert measured["sim-h20"] * 10 < measured["sim-h100"] < measured["sim-l20"] < measured["sim-a100"]


def test_each_knob_moves_mismatch_the_documented_way(sim, reference) -> None:
    _, ref = reference
    h100 = sim.pool("sim-h100")
    fp32 = sim.pool("sim-h100", dtype="fp32", lm_head="fp32", kv_cache="fp32",
                    reduction_order="default")
    base = measure_k3(ref, h100)
    assert measure_k3(ref, fp32) < 1e-10  # fp32 with a KV cache: rounding noise only
    assert measure_k3(ref, h100, rollout=RolloutSpec(deterministic=True)) == 0.0
    fp16 = RolloutSpec(dtype="fp16", lm_head_fp32=True, kv_cache_dtype="fp16",
                       reduction_order="default")
    assert measure_k3(ref, h100, rollout=fp16) < base / 10  # the flags override the pool
    assert measure_k3(ref, sim.pool("sim-h100", weight_quant="int4")) > 3 * base
    assert measure_k3(ref, h100, rollout=RolloutSpec(weight_lag=1)) > 10 * base
