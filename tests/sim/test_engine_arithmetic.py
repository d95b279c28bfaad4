"""The rollout engine's explicit low-precision arithmetic (fp32 GEMM over rounded operands,
rounded output) against the CPU's native bf16/fp16 kernels, and against an exact reference.

Where every partial sum is exact in fp32 the order of the sum cannot matter, so explicit and
native must agree to the last bit. On general operands the two sum in different orders; the
stated bound is one unit in the last place (ulp) of the low-precision output plus fp32's
accumulation error bound, K * 2^-24 * sum_k |a_k b_k| (which only matters where the sum cancels
to far below its terms). Both are checked against the exact result computed in float64, and
most outputs agree with the native kernel bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from orchestrator.engine import RolloutSpec
from orchestrator.sim.model import matmul_rounded
from orchestrator.sim.profile import SimProfile, resolve_numerics
from orchestrator.sim.rollout import EngineOps

DTYPES = [torch.bfloat16, torch.float16]
SHAPES = [(19, 64, 192), (256, 64, 128), (128, 128, 64), (7, 16, 32)]


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of the low-precision dtype at |x| (float64)."""
    mant = {torch.bfloat16: 7, torch.float16: 10}[x.dtype]
    exp = torch.floor(torch.log2(x.double().abs().clamp_min(1e-30)))
    if x.dtype == torch.float16:
        exp = exp.clamp_min(-14)  # subnormal spacing
    return torch.exp2(exp - mant)


def _excess(x: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """max |x - ref| / (ulp + fp32 accumulation bound): <= 1 is within the stated bound."""
    k = a.shape[-1]
    accumulation = k * 2.0 ** -24 * (a.double().abs() @ b.double().abs())
    bound = torch.maximum(_ulp(ref), _ulp(x)) + accumulation
    return ((x.double() - ref.double()).abs() / bound).max().item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_sums_agree_with_native_kernels_to_the_last_bit(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    for m, k, n in SHAPES:
        # Small integers: every product and partial sum is exact in fp32, in any order.
        a = torch.randint(-8, 9, (m, k), generator=g).to(dtype)
        b = torch.randint(-8, 9, (k, n), generator=g).to(dtype) * 0.25
        explicit, native = matmul_rounded(a, b), torch.matmul(a, b)
        assert explicit.dtype == native.dtype == dtype
        assert torch.equal(explicit, native), (dtype, m, k, n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_general_operands_within_one_ulp_of_native_and_of_the_exact_result(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    equal_native = total = 0
    for m, k, n in SHAPES:
        a = (torch.randn(m, k, generator=g) * 0.5).to(dtype)
        b = (torch.randn(k, n, generator=g) * 0.1).to(dtype)
        explicit = matmul_rounded(a, b)
        exact = (a.double() @ b.double()).to(dtype)  # correctly rounded (double is exact here)
        native = torch.matmul(a, b)
        assert _excess(explicit, exact, a, b) <= 1.0, (dtype, m, k, n)
        assert _excess(native, exact, a, b) <= 1.0, (dtype, m, k, n)
        assert _excess(explicit, native, a, b) <= 1.0, (dtype, m, k, n)
        equal_native += int((explicit == native).sum())
        total += explicit.numel()
    # Different summation orders rarely move the rounded output at all (measured on an AVX-512
    # machine with native bf16: bf16 100% equal, fp16 99.9%).
    assert equal_native / total > 0.98, equal_native / total


def test_explicit_engine_linear_matches_native_engine_within_one_ulp() -> None:
    """The whole engine GEMM path (weights converted at sync, split-K partials in bf16, fp8
    W8A8) computed both ways on the same weights."""
    g = torch.Generator().manual_seed(2)
    params = {"l0_fc1": torch.randn(128, 64, generator=g) * 0.05}
    x = torch.randn(3, 19, 64, generator=g)
    for profile in (SimProfile(), SimProfile(reduction_order="chunked", split_k=16),
                    SimProfile(dtype="fp16", reduction_order="reversed"), SimProfile(dtype="fp8")):
        num = resolve_numerics(profile, RolloutSpec())
        out = {}
        for kernels in ("explicit", "native"):
            ops = EngineOps(num, kernels)
            out[kernels] = ops.linear(ops.cast(x), ops.convert(params), "l0_fc1")
        assert out["explicit"].dtype == out["native"].dtype
        # Relative to the output's scale: the two may differ only where a partial GEMM sum
        # rounds differently (split-K then adds that ulp into a bf16 sum).
        diff = (out["explicit"].double() - out["native"].double()).abs()
        scale = _ulp(out["native"].abs().amax(-1, keepdim=True).to(out["native"].dtype))
        assert (diff / scale).max().item() <= 1.0, profile
        assert (out["explicit"] == out["native"]).float().mean().item() > 0.98, profile


def test_explicit_gemm_never_calls_a_low_precision_kernel() -> None:
    """What makes it machine-independent: the GEMM itself runs in fp32."""
    a, b = torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8, 2, dtype=torch.bfloat16)
    seen: list[torch.dtype] = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.matmul:
                seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    with Spy():
        matmul_rounded(a, b)
    assert seen == [torch.float32]
