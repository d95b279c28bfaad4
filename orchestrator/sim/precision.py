"""The simulator trainer's compute precision (``learner.precision``): autocast, made explicit.

``fp32`` (and the default) is the trainer's plain fp32 arithmetic (``model.ExactOps``). ``bf16``
and ``fp16`` are what FSDP mixed precision with autocast computes (verl's default trainer): fp32
master weights and optimizer, every GEMM (linears, attention scores and values, the LM head) on
operands rounded to the precision with fp32 accumulation and an output rounded to it; embeddings,
LayerNorm, softmax, the residual stream and the loss stay fp32. Gradients flowing back through a
rounded output are rounded the same way (the cast's backward), so fp16 gradients underflow like
a real fp16 backward, which is why fp16 trains with dynamic loss scaling (:class:`LossScaler`).

As in the rollout engine (``sim/rollout.py``), every low-precision GEMM is an fp32 GEMM over
rounded operands (``model.matmul_rounded``), never a native bf16/fp16 kernel, so the numbers are
the same on every CPU the pinned BLAS runs on (``tests/sim/test_trainer_precision.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.sim.model import ExactOps

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``dtype`` and held in fp32 (exact); differentiable (the backward rounds
    the incoming gradient to ``dtype`` too, as a low-precision backward GEMM's input is)."""
    return x.to(dtype).float()


class TrainerOps(ExactOps):
    """Autocast arithmetic of the trainer in ``precision`` (bf16 | fp16)."""

    def __init__(self, precision: str) -> None:
        self.dtype = DTYPES[precision]

    def _gemm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xr, wr = _round(x, self.dtype), _round(w, self.dtype)
        out = F.linear(xr, wr) if wr.dim() == 2 else torch.matmul(xr, wr.transpose(-1, -2))
        return _round(out, self.dtype)

    def linear(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return self._gemm(x, p[name])

    def router(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return self._gemm(x, p[name])

    def head(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._gemm(x, p["head"])

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _round(torch.matmul(_round(a, self.dtype), _round(b, self.dtype)), self.dtype)


def trainer_ops(precision: str | None) -> ExactOps | None:
    """The trainer's arithmetic for ``learner.precision`` (None: the plain fp32 default)."""
    return None if precision in (None, "fp32") else TrainerOps(precision)


class LossScaler:
    """Dynamic loss scaling as torch's (Sharded)GradScaler does it for verl's fp16 trainer:
    scale 2^16, halved on a non-finite gradient (the step is skipped), doubled after
    ``growth_interval`` finite steps in a row (verl passes 400)."""

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 400) -> None:
        self.scale, self.growth_interval, self.good = scale, growth_interval, 0

    def update(self, finite: bool) -> None:
        if not finite:
            self.scale, self.good = self.scale * 0.5, 0
            return
        self.good += 1
        if self.good == self.growth_interval:
            self.scale, self.good = self.scale * 2.0, 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "good": float(self.good)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self.good = float(state["scale"]), int(state["good"])
