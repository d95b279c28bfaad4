"""The rollout engine: samples with a KV cache in its own numeric path and returns mu.

It holds its own copy of the weights, converted at every weight sync into the engine's format
(bf16/fp16 tensors, or fp8-e4m3 values with per-channel scales), optionally ``weight_lag`` steps
stale. Mismatch against the fp32 trainer comes only from that arithmetic: rounding of weights,
activations, logits and K/V, and the order of reductions. Nothing is added.

With ``deterministic`` the engine computes exactly like the trainer: fp32 weights and every
decode step a full forward over the trainer's padded ``[B, T]`` shape (no KV cache), which is
what makes mu bitwise equal to pi_old -- and what it costs.
"""
from __future__ import annotations

import collections
import dataclasses

import torch
import torch.nn.functional as F

from orchestrator.sim.model import ExactOps, KVCache, ModelConfig, forward, matmul_rounded
from orchestrator.sim.profile import Numerics
from orchestrator.sim.task import EOS, PAD, Task, response_mask

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0  # largest finite e4m3fn value


def _int4_dequant(w: torch.Tensor, group: int) -> torch.Tensor:
    """W4A16: symmetric int4 per group of ``group`` input channels, dequantised to fp32."""
    k = w.shape[-1]
    g = group if k % group == 0 else k
    wg = w.reshape(*w.shape[:-1], k // g, g)
    scale = wg.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7.0
    return ((wg / scale).round().clamp(-8, 7) * scale).reshape(w.shape)


def _fp8_quant(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric e4m3 quantisation along ``dim``: (values held exactly in bf16, fp32 scale)."""
    scale = x.float().abs().amax(dim=dim, keepdim=True).clamp_min(1e-12) / FP8_MAX
    q = (x.float() / scale).to(torch.float8_e4m3fn).to(torch.bfloat16)
    return q, scale


class EngineOps:
    """Low-precision arithmetic of the rollout engine (see ``profile.SimProfile``).

    ``kernels="explicit"`` (always, in trials) computes every low-precision GEMM as an fp32 GEMM
    over rounded operands (:func:`model.matmul_rounded`): the documented arithmetic, the same on
    every CPU. ``kernels="native"`` runs the CPU's own bf16/fp16 kernels instead (what ``sim-1``
    did); it exists to verify the explicit arithmetic against them and to measure the speed-up
    (``tests/sim/test_engine_arithmetic.py``, ``benchmarks/sim_numerics.py``).
    """

    def __init__(self, num: Numerics, kernels: str = "explicit") -> None:
        if kernels not in ("explicit", "native"):
            raise ValueError(f"kernels must be explicit or native, got {kernels!r}")
        self.num, self.native = num, kernels == "native"
        self.act_dtype = torch.bfloat16 if num.dtype == "fp8" else DTYPES[num.dtype]
        self.kv_dtype = DTYPES[num.kv_cache]

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Attention's own GEMMs (scores, probabilities x values) in the activation dtype."""
        return torch.matmul(a, b) if self.native else matmul_rounded(a, b)

    def cast(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.act_dtype)

    def _mm(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str,
            out_dtype: torch.dtype) -> torch.Tensor:
        """``x @ W.T`` with the output rounded to ``out_dtype``: the engine's documented
        arithmetic (operands in their low precision, exact products, fp32 accumulation, rounded
        output), computed explicitly as an fp32 GEMM over the rounded operands (see
        :func:`model.matmul_rounded`). ``p[name]`` is W.T in fp32, holding the rounded values."""
        chunks = p.get(name + "@chunks")
        if chunks is not None:
            return self._split_k(x, chunks, out_dtype)
        if self.num.reduction_order == "reversed":  # weights were stored K-reversed at sync
            x = x.flip(-1)
        w = p[name]
        if self.native:  # the CPU's own kernel: operands and output in the low dtype
            return torch.matmul(x, w).to(out_dtype)
        return torch.matmul(x.float(), w).to(out_dtype)

    def _split_k(self, x: torch.Tensor, chunks: torch.Tensor,
                 out_dtype: torch.dtype) -> torch.Tensor:
        """split-K: each K-chunk's partial product is written in ``out_dtype`` and the partials
        are summed one by one in that dtype, as a split-K kernel with a low-precision workspace
        does. ``chunks`` is W.T cut along K (fp32 holding the rounded values):
        [n, (E), split_k, O]; one batched GEMM over the chunk dimension yields all n partials."""
        n, s = chunks.shape[0], chunks.shape[-2]
        xc = (x if self.native else x.float()).unflatten(-1, (n, s)).movedim(-2, 0)  # [n, ..., s]
        if chunks.dim() == 3:  # one weight: all rows in one GEMM per chunk
            parts = torch.matmul(xc.reshape(n, -1, s), chunks)
            parts = parts.view(n, *x.shape[:-1], chunks.shape[-1])
        else:  # MoE experts [n, E, s, O]: x is [N, K] (every expert) or [E, N, K]
            parts = torch.matmul(xc if xc.dim() == 4 else xc.unsqueeze(1), chunks)
        parts = parts.to(out_dtype)  # each partial written in the workspace dtype
        acc = parts[0]
        for i in range(1, n):
            acc = acc + parts[i]
        return acc

    def _chunks(self, wt: torch.Tensor) -> torch.Tensor | None:
        """W.T [(E), K, O] as K-chunks [n, (E), split_k, O], or None if K does not split."""
        k = wt.shape[-2]
        s = self.num.split_k
        if k % s or k <= s:
            return None
        return wt.unflatten(-2, (k // s, s)).movedim(-3, 0).contiguous()

    def _lin(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str,
             dtype: str) -> torch.Tensor:
        """``x @ W.T`` in ``dtype``; the output is in ``dtype`` (bf16 for fp8)."""
        if dtype == "fp8":  # W8A8: per-token activation scale, per-channel weight scale
            xq, sx = _fp8_quant(x, -1)
            y = self._mm(xq, p, name, torch.bfloat16).float() * sx * p[name + "@s"]
            return y.to(torch.bfloat16)
        dt = DTYPES[dtype]
        return self._mm(x.to(dt), p, name, dt)

    def linear(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return self._lin(x, p, name, self.num.dtype).to(self.act_dtype)

    def router(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return self._lin(x, p, name, self.num.router)  # the caller upcasts for the softmax

    def gate(self, logits: torch.Tensor) -> torch.Tensor:
        """Softmax in fp32, probabilities rounded back to the router logits' dtype, then top-k
        on those (Megatron's ``softmax(..., dtype=float32).type_as(logits)`` without
        ``moe_router_dtype: fp32``): experts whose probabilities round to the same value tie
        and the top-k kernel's own order decides, where the fp32 trainer picks the truly larger
        one. The rounded probabilities are also the gate weights."""
        return torch.softmax(logits.float(), dim=-1).to(logits.dtype).float()

    def head(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        # Logits come back in the head's own dtype (fp32 head -> fp32 logits, no rounding).
        return self._lin(x, p, "head", self.num.lm_head)

    def store_kv(self, x: torch.Tensor) -> torch.Tensor:
        # Rounded to the KV dtype, held in the activation dtype (the rounded value is exact there,
        # fp16 range limits aside): reading the cache then converts nothing.
        return x.to(self.kv_dtype).to(self.act_dtype)

    def convert(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Engine-format copy of fp32 trainer weights (the 'weight sync'). A linear's weight is
        rounded to its dtype and kept as W.T in fp32 (exact: every low-precision value is an fp32
        value), the form the explicit GEMM reads."""
        out: dict[str, torch.Tensor] = {}
        for name, w in params.items():
            kind = self._kind(name)
            if kind is None:  # embeddings, LayerNorm: activation dtype
                out[name] = w.to(self.act_dtype)
                continue
            if self.num.reduction_order == "reversed":
                w = w.flip(-1)
            if self.num.weight_quant == "int4" and name != "head" and not name.endswith("_router"):
                w = _int4_dequant(w, self.num.group_size)
            if kind == "fp8":
                q, s = _fp8_quant(w, -1)  # per output channel
                rounded, out[name + "@s"] = q, s.transpose(-1, -2)
            else:
                rounded = w.to(DTYPES[kind])
            wt = rounded.transpose(-1, -2).contiguous()
            out[name] = wt if self.native else wt.float()
            if self.num.reduction_order == "chunked":
                chunks = self._chunks(out[name])
                if chunks is not None:
                    out[name + "@chunks"] = chunks
        return out

    def _kind(self, name: str) -> str | None:
        if name == "head":
            return self.num.lm_head
        if name.endswith("_router"):
            return self.num.router
        if name.endswith(("_qkv", "_out", "_fc1", "_fc2")):
            return self.num.dtype
        return None


def _sample(logp: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row from ``logp`` [B, V] by inverting the CDF with one uniform draw per row
    (~7x cheaper than ``torch.multinomial`` at this size). The draw is scaled by the row's total
    and the index capped at the first position holding that total (the last token of non-zero
    probability; reached only when the fp32 product rounds up to the total), so a token of zero
    probability is never drawn."""
    cdf = logp.exp().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(logp.shape[0], 1, generator=gen) * total
    idx = torch.searchsorted(cdf, u, right=True)
    return torch.minimum(idx, (cdf < total).sum(-1, keepdim=True)).squeeze(1)


@dataclasses.dataclass
class Rollouts:
    prompts: torch.Tensor  # [B, P]
    tokens: torch.Tensor  # [B, P + R] prompt + response (PAD after EOS)
    logp_mu: torch.Tensor  # [B, R] rollout log-prob of each sampled token (fp32)
    mask: torch.Tensor  # [B, R] response mask (through the first EOS)
    routing: list[torch.Tensor]  # MoE: per layer [B, P + R - 1, k] rollout expert indices

    @property
    def responses(self) -> torch.Tensor:
        return self.tokens[:, self.prompts.shape[1]:]


class RolloutEngine:
    """Generates rollouts with its own (lagged, low-precision) copy of the policy."""

    def __init__(self, cfg: ModelConfig, task: Task, num: Numerics,
                 kernels: str = "explicit") -> None:
        self.cfg, self.task, self.num = cfg, task, num
        self.ops = ExactOps() if num.deterministic else EngineOps(num, kernels)
        self.queue: collections.deque[dict[str, torch.Tensor]] = collections.deque()
        self.params: dict[str, torch.Tensor] = {}

    def sync(self, trainer_params: dict[str, torch.Tensor]) -> None:
        """Receive the trainer's weights; the engine serves the ones ``weight_lag`` syncs old."""
        self.queue.append({k: v.detach().clone() for k, v in trainer_params.items()})
        while len(self.queue) > self.num.weight_lag + 1:
            self.queue.popleft()
        served = self.queue[0]
        self.params = served if self.num.deterministic else self.ops.convert(served)

    def state(self) -> dict[str, torch.Tensor]:
        """The stale-weight queue, flattened for ``torch.save`` (restored by ``load_state``)."""
        return {f"{i}/{k}": v for i, snap in enumerate(self.queue) for k, v in snap.items()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        snaps: dict[int, dict[str, torch.Tensor]] = {}
        for key, v in state.items():
            i, name = key.split("/", 1)
            snaps.setdefault(int(i), {})[name] = v
        self.queue = collections.deque(snaps[i] for i in sorted(snaps))
        served = self.queue[0]
        self.params = served if self.num.deterministic else self.ops.convert(served)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, gen: torch.Generator) -> Rollouts:
        b, plen = prompts.shape
        rlen = self.task.response_len
        tokens = torch.full((b, plen + rlen), PAD, dtype=torch.long)
        tokens[:, :plen] = prompts
        logp = torch.zeros(b, rlen)
        done = torch.zeros(b, dtype=torch.bool)
        if self.num.deterministic:
            step_logp, routing = self._exact_steps(tokens), []
        else:
            step_logp, routing = self._cached_steps(tokens)
        for r in range(rlen):
            lp = next(step_logp) if r == 0 else step_logp.send(tokens)
            tok = _sample(lp, gen)
            logp[:, r] = lp.gather(1, tok[:, None]).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, PAD), tok)
            tokens[:, plen + r] = tok
            done |= tok == EOS
        step_logp.close()
        mask = response_mask(tokens[:, plen:])
        return Rollouts(prompts, tokens, logp * mask, mask,
                        [torch.cat(r, dim=1) for r in routing] if routing else [])

    def _cached_steps(self, tokens: torch.Tensor):
        """Coroutine: log-probs of the next token, decoding with the KV cache."""
        plen = self.task.prompt_len
        cache = KVCache.empty(self.cfg, tokens.shape[0], self.ops.act_dtype)
        routing: list[list[torch.Tensor]] = [[] for _ in range(self.cfg.n_layers)] if self.cfg.moe else []
        chunk = self.num.chunked_prefill or plen

        def run(x: torch.Tensor) -> torch.Tensor:
            out = forward(self.params, x, self.cfg, self.ops, cache=cache,
                          temperature=self.num.temperature)
            for layer, idx in zip(routing, out.routing):
                layer.append(idx)
            return F.log_softmax(out.logits[:, -1].float(), dim=-1)

        def gen():
            for s in range(0, plen, chunk):
                lp = run(tokens[:, s:min(s + chunk, plen)])
            pos = plen
            while True:
                cur = yield lp
                lp = run(cur[:, pos:pos + 1])
                pos += 1

        return gen(), routing

    def _exact_steps(self, tokens: torch.Tensor):
        """Coroutine: the trainer's own computation, full padded sequence every step."""
        plen = self.task.prompt_len

        def gen():
            pos = plen - 1
            cur = tokens
            while True:
                out = forward(self.params, cur, self.cfg, ExactOps(),
                              temperature=self.num.temperature)
                cur = yield F.log_softmax(out.logits, dim=-1)[:, pos]
                pos += 1

        return gen()
