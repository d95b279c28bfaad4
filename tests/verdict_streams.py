"""Synthetic metric streams with the shapes the seeds describe, for verdict and tracking tests.

Each generator returns ``[(step, {metric: value})]`` with steps 1..n, seeded numpy noise, and the
verl metric names from ``orchestrator.metrics``. Eval reward appears every ``eval_every`` steps
like the simulator's.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from orchestrator import metrics as M

Stream = list[tuple[int, dict[str, float]]]


def _base(n: int, rng: np.random.Generator, *, reward_peak: float = 0.7, noise: float = 0.03,
          grad_sigma: float = 0.15, k3_start: float = 2e-4, k3_growth: float = 5.0) -> Stream:
    rows: Stream = []
    for s in range(1, n + 1):
        frac = s / n
        reward = reward_peak * (1 - math.exp(-5 * frac)) + 0.05
        rows.append((s, {
            M.TRAIN_REWARD: reward + rng.normal(0, noise),
            M.GRAD_NORM: float(np.exp(rng.normal(0, grad_sigma))) * (1 + 0.5 * frac),
            # Healthy k3 drifts up slowly as logits sharpen (simulator probe: ~100x over a run).
            M.K3_KL: k3_start * math.exp(math.log(k3_growth) * frac) * float(np.exp(rng.normal(0, 0.2))),
            M.TRAINING_PPL: 8.0 * math.exp(-1.5 * frac) + 1.0 + abs(rng.normal(0, 0.05)),
            M.ENTROPY: 2.0 * math.exp(-1.2 * frac) + 0.1,
        }))
    return rows


def _add_eval(rows: Stream, every: int, rng: np.random.Generator, noise: float = 0.02) -> Stream:
    for s, row in rows:
        if s % every == 0:
            row[M.EVAL_REWARD] = row[M.TRAIN_REWARD] + rng.normal(0, noise)
    return rows


def healthy(n: int = 300, seed: int = 0, eval_every: int = 10) -> Stream:
    rng = np.random.default_rng(seed)
    return _add_eval(_base(n, rng), eval_every, rng)


def noisy_healthy(n: int = 300, seed: int = 0, eval_every: int = 10) -> Stream:
    """Heavy noise everywhere and isolated grad-norm spikes (4-8x) that never persist."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng, noise=0.08, grad_sigma=0.45)
    for s, row in rows:
        if rng.random() < 0.03:
            row[M.GRAD_NORM] *= float(rng.uniform(4, 8))
        row[M.K3_KL] *= float(np.exp(rng.normal(0, 0.6)))
    return _add_eval(rows, eval_every, rng, noise=0.06)


def slow_drift_healthy(n: int = 300, seed: int = 0, eval_every: int = 10) -> Stream:
    """k3 grows 100x over the run (logits sharpen) and grad norm 3x, reward keeps improving."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng, k3_growth=100.0)
    for s, row in rows:
        row[M.GRAD_NORM] *= 1 + 2 * s / n
    return _add_eval(rows, eval_every, rng)


def explosion(n: int = 300, seed: int = 0, onset: int = 180, eval_every: int = 10,
              k3_lead: int = 40) -> Stream:
    """Seed 000/002 shape: k3 rises from ``onset - k3_lead``, then grad norm and PPL blow up at
    ``onset`` and the reward collapses a few steps later."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    for s, row in rows:
        if s >= onset - k3_lead:
            row[M.K3_KL] *= math.exp(0.08 * (s - onset + k3_lead))
        if s >= onset:
            t = s - onset
            row[M.GRAD_NORM] *= 20 + 5 * t
            row[M.TRAINING_PPL] *= 4 + 0.2 * t
            row[M.ENTROPY] *= 3
        if s >= onset + 5:
            row[M.TRAIN_REWARD] = 0.05 + rng.normal(0, 0.02)
    return _add_eval(rows, eval_every, rng)


def slow_collapse(n: int = 300, seed: int = 0, start: int = 150, eval_every: int = 10) -> Stream:
    """The reward drifts down from its peak over ~100 steps with no grad-norm explosion."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    for s, row in rows:
        if s >= start:
            row[M.TRAIN_REWARD] = max(row[M.TRAIN_REWARD] * (1 - (s - start) / 100), 0.0) + 0.02
    return _add_eval(rows, eval_every, rng)


def dip_and_recover(n: int = 300, seed: int = 0, start: int = 120, length: int = 25,
                    eval_every: int = 10) -> Stream:
    """The reward loses ~70% for ``length`` steps and comes back: unstable, not collapsed."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    for s, row in rows:
        if start <= s < start + length:
            row[M.TRAIN_REWARD] *= 0.3
    return _add_eval(rows, eval_every, rng)


def entropy_collapse_then_ordinary(n: int = 300, seed: int = 0, collapse_at: int = 100,
                                   resume_at: int = 160, explode_at: int | None = None,
                                   eval_every: int = 10) -> Stream:
    """The policy turns near-deterministic at ``collapse_at`` (entropy ~1e-3, grad norm ~0.004, so
    the grad-norm median sinks to ~0), then ordinary gradients (~0.5) come back at ``resume_at``:
    100x the median but not an explosion. The reward holds. ``explode_at``: a real explosion
    (grad norm 30-300) later on top, which must still fire."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    for s, row in rows:
        if collapse_at <= s < resume_at:
            row[M.GRAD_NORM] = 0.004 * float(np.exp(rng.normal(0, 0.3)))
            row[M.ENTROPY] = 1e-3 * float(np.exp(rng.normal(0, 0.3)))
        elif s >= resume_at:
            row[M.GRAD_NORM] = 0.5 * float(np.exp(rng.normal(0, 0.3)))
            row[M.ENTROPY] = 0.05
        if explode_at is not None and s >= explode_at:
            row[M.GRAD_NORM] = 30.0 * (1 + (s - explode_at)) * float(np.exp(rng.normal(0, 0.3)))
            row[M.TRAINING_PPL] *= 4
    return _add_eval(rows, eval_every, rng)


def dead_policy(n: int = 300, seed: int = 0, at: int | None = 150, blips: int = 0,
                eval_every: int = 10) -> Stream:
    """From ``at`` the policy is deterministic: entropy ~1e-9, grad norm exactly 0 (all group
    advantages 0), reward frozen. ``blips``: that many isolated runs of 1-3 zero-gradient steps in
    an otherwise healthy run (a batch whose groups all scored alike), which are not a collapse."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    frozen = None
    for s, row in rows:
        if at is not None and s >= at:
            frozen = frozen if frozen is not None else row[M.TRAIN_REWARD]
            row.update({M.GRAD_NORM: 0.0, M.ENTROPY: 1e-9, M.TRAINING_PPL: 1.0, M.TRAIN_REWARD: frozen})
    for start in rng.choice(np.arange(20, n - 5), size=blips, replace=False):
        for s in range(int(start), int(start) + int(rng.integers(1, 4))):
            rows[s - 1][1][M.GRAD_NORM] = 0.0
    return _add_eval(rows, eval_every, rng)


def flat_near_zero_reward(n: int = 300, seed: int = 0, level: float = 0.03, noise: float = 0.02,
                          eval_every: int = 10) -> Stream:
    """A run that never learns: the reward sits at ``level`` (clipped at 0) with noise. Its peak
    is near 0, so any dip is a large *fraction* of it, but not a collapse."""
    rng = np.random.default_rng(seed)
    rows = _base(n, rng)
    for s, row in rows:
        row[M.TRAIN_REWARD] = max(level + rng.normal(0, noise), 0.0)
    return _add_eval(rows, eval_every, rng, noise=noise)


def with_nan(n: int = 100, seed: int = 0, at: int = 60) -> Stream:
    rows = healthy(n, seed)
    rows[at - 1][1][M.GRAD_NORM] = float("nan")
    return rows


def metric_rows(n_steps: int, n_metrics: int, seed: int = 0) -> Stream:
    """``n_steps`` x ``n_metrics`` values with verl-like names (for tracking tests/benchmarks)."""
    rng = np.random.default_rng(seed)
    names = [M.TRAIN_REWARD, M.GRAD_NORM, M.K3_KL, M.ENTROPY, M.TRAINING_PPL]
    names += [f"rollout_corr/extra_{i}" for i in range(max(n_metrics - len(names), 0))]
    names = names[:n_metrics]
    return [(s, {k: float(v) for k, v in zip(names, rng.random(n_metrics))}) for s in range(1, n_steps + 1)]


def as_history(rows: Stream) -> list[tuple[int, Mapping[str, float]]]:
    return [(s, dict(r)) for s, r in rows]
