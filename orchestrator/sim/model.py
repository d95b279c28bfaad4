"""Tiny causal transformer policy (dense or top-k MoE), written as one functional forward.

The same ``forward`` serves the trainer (fp32, whole sequences) and the rollout engine (its own
numerics via an ``Ops`` object, KV cache, one token at a time). Sharing the code is what makes
``rollout.deterministic`` exact: with :class:`ExactOps` and the trainer's shapes the engine runs
the very same arithmetic as the trainer.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int
    max_len: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    arch: str = "dense"  # dense | moe
    n_experts: int = 4
    top_k: int = 1
    expert_d_ff: int | None = None  # hidden size of each expert (None: d_ff)

    @property
    def moe(self) -> bool:
        return self.arch == "moe"

    @property
    def d_expert(self) -> int:
        return self.expert_d_ff or self.d_ff


def init_params(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """GPT-2 style init, deterministic given ``seed`` (its own generator, no global RNG)."""
    g = torch.Generator().manual_seed(seed)
    d, f, std = cfg.d_model, cfg.d_ff, 0.02
    proj_std = std / math.sqrt(2 * cfg.n_layers)  # residual projections scaled by depth

    def normal(*shape: int, s: float = std) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * s

    p: dict[str, torch.Tensor] = {"tok_emb": normal(cfg.vocab, d), "pos_emb": normal(cfg.max_len, d)}
    for i in range(cfg.n_layers):
        p[f"l{i}_ln1_w"], p[f"l{i}_ln1_b"] = torch.ones(d), torch.zeros(d)
        p[f"l{i}_qkv"] = normal(3 * d, d)
        p[f"l{i}_out"] = normal(d, d, s=proj_std)
        p[f"l{i}_ln2_w"], p[f"l{i}_ln2_b"] = torch.ones(d), torch.zeros(d)
        if cfg.moe:
            p[f"l{i}_router"] = normal(cfg.n_experts, d)
            fe = cfg.d_expert
            p[f"l{i}_fc1"] = normal(cfg.n_experts, fe, d)
            p[f"l{i}_fc2"] = normal(cfg.n_experts, d, fe, s=proj_std)
        else:
            p[f"l{i}_fc1"] = normal(f, d)
            p[f"l{i}_fc2"] = normal(d, f, s=proj_std)
    p["lnf_w"], p["lnf_b"] = torch.ones(d), torch.zeros(d)
    p["head"] = normal(cfg.vocab, d)
    return p


class ExactOps:
    """The trainer's arithmetic: fp32 everywhere, one matmul per linear."""

    act_dtype = torch.float32
    kv_dtype = torch.float32

    def cast(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def linear(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        w = p[name]
        return F.linear(x, w) if w.dim() == 2 else torch.matmul(x, w.transpose(-1, -2))

    def router(self, x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        return F.linear(x, p[name])

    def gate(self, logits: torch.Tensor) -> torch.Tensor:
        """Routing probabilities [N, E] (fp32) from router logits."""
        return torch.softmax(logits.float(), dim=-1)

    def head(self, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.linear(x, p["head"])

    def store_kv(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def matmul_rounded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as a low-precision kernel with fp32 accumulation computes it: the operands as
    held (already rounded to their dtype), every product exact (two bf16 or fp16 values multiply
    exactly in fp32), fp32 sums, the output rounded to ``a``'s dtype.

    Computed as an fp32 GEMM, never by a native bf16/fp16 kernel: which of those a CPU has
    (AVX512-BF16, AMX, a slow fallback) and how it sums would make the numbers a property of the
    processor, and the fallback is ~25x slower than fp32 on AVX2. The order of the fp32 sum is
    the pinned BLAS's (``orchestrator/sim/numerics.py``). fp32 operands: a plain matmul."""
    if a.dtype == torch.float32:
        return torch.matmul(a, b)
    return torch.matmul(a.float(), b.float()).to(a.dtype)


@dataclasses.dataclass
class KVCache:
    """Preallocated per-layer K/V buffers of the rollout engine; ``length`` positions are filled."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, dtype: torch.dtype) -> KVCache:
        shape = (batch, cfg.n_heads, cfg.max_len, cfg.d_model // cfg.n_heads)
        return cls([torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)],
                   [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)])


@dataclasses.dataclass
class ForwardOut:
    logits: torch.Tensor  # [B, T, V] fp32, already divided by the temperature
    aux_loss: torch.Tensor  # MoE load-balancing loss (0 for dense)
    routing: list[torch.Tensor]  # per layer [B, T, k] expert indices used (empty for dense)


@functools.lru_cache(maxsize=32)
def _future(t: int, start: int) -> torch.Tensor:
    """[t, start + t] mask of the keys a query must not see (built once per shape)."""
    return ~torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)


def _attention(x: torch.Tensor, p: dict[str, torch.Tensor], i: int, cfg: ModelConfig, ops,
               cache: KVCache | None, start: int) -> torch.Tensor:
    b, t, d = x.shape
    h, dh = cfg.n_heads, d // cfg.n_heads
    q, k, v = ops.linear(x, p, f"l{i}_qkv").view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4)
    if cache is not None:
        cache.k[i][:, :, start:start + t] = ops.store_kv(k)
        cache.v[i][:, :, start:start + t] = ops.store_kv(v)
        k = cache.k[i][:, :, :start + t].to(q.dtype)
        v = cache.v[i][:, :, :start + t].to(q.dtype)
    scores = (ops.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))).float()
    if t > 1:  # query at absolute position start+r sees keys 0..start+r (one query sees all)
        scores = scores.masked_fill(_future(t, start), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)  # softmax in fp32, like fused kernels
    out = ops.matmul(probs, v).transpose(1, 2).reshape(b, t, d)
    return ops.linear(out, p, f"l{i}_out")


def _moe(x: torch.Tensor, p: dict[str, torch.Tensor], i: int, cfg: ModelConfig, ops,
         replay: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t, d = x.shape
    flat = x.reshape(b * t, d)
    probs = ops.gate(ops.router(flat, p, f"l{i}_router"))  # [N, E] fp32
    idx = probs.topk(cfg.top_k, dim=-1).indices  # [N, k]
    if replay is not None:  # routing replay: indices from another pass, gate weights stay live
        idx = idx.view(b, t, cfg.top_k).clone()
        n = min(replay.shape[1], t)
        idx[:, :n] = replay[:, :n]
        idx = idx.view(b * t, cfg.top_k)
    gates = probs.gather(-1, idx)
    if cfg.top_k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    # Every expert runs on every token, then the chosen ones are gathered: the per-row
    # arithmetic then never depends on which other tokens share an expert (needed for the
    # bitwise-exact deterministic mode), at E/k times the FFN cost of a grouped dispatch.
    hid = F.gelu(ops.linear(flat, p, f"l{i}_fc1"))  # [E, N, f]
    out_all = ops.linear(hid, p, f"l{i}_fc2")  # [E, N, d]
    rows = torch.arange(b * t)
    out = sum(out_all[idx[:, j], rows] * gates[:, j:j + 1].to(out_all.dtype)
              for j in range(cfg.top_k))
    # Switch-transformer balance loss: E * sum_e (fraction of routed slots_e * mean prob_e).
    frac = F.one_hot(idx, cfg.n_experts).float().mean((0, 1))
    aux = cfg.n_experts * (frac * probs.mean(0)).sum()
    return out.view(b, t, d), aux, idx.view(b, t, cfg.top_k)


def forward(p: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: ModelConfig, ops=None, *,
            cache: KVCache | None = None, temperature: float = 1.0,
            replay: list[torch.Tensor] | None = None) -> ForwardOut:
    """Logits for ``tokens`` [B, T]; with ``cache`` the tokens continue at ``cache.length``."""
    ops = ops or ExactOps()
    start = cache.length if cache is not None else 0
    t = tokens.shape[1]
    x = ops.cast(p["tok_emb"][tokens] + p["pos_emb"][start:start + t])
    aux = torch.zeros(())
    routing: list[torch.Tensor] = []
    for i in range(cfg.n_layers):
        hn = F.layer_norm(x, (cfg.d_model,), p[f"l{i}_ln1_w"], p[f"l{i}_ln1_b"])
        x = x + _attention(hn, p, i, cfg, ops, cache, start)
        hn = F.layer_norm(x, (cfg.d_model,), p[f"l{i}_ln2_w"], p[f"l{i}_ln2_b"])
        if cfg.moe:
            y, a, idx = _moe(hn, p, i, cfg, ops, replay[i] if replay else None)
            aux, x = aux + a, x + y
            routing.append(idx)
        else:
            x = x + ops.linear(F.gelu(ops.linear(hn, p, f"l{i}_fc1")), p, f"l{i}_fc2")
    x = F.layer_norm(x, (cfg.d_model,), p["lnf_w"], p["lnf_b"])
    logits = ops.head(x, p).float()
    if temperature != 1.0:
        logits = logits / temperature
    if cache is not None:
        cache.length = start + t
    return ForwardOut(logits, aux / max(cfg.n_layers, 1), routing)
