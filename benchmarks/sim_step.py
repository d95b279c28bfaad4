"""Simulator speed figures (a benchmark, not a test): prints

(a) wall time of a 300-step trial of the quickstart config (pool sim-h100, token TIS), goal < 30 s;
(b) median step time vs the bare work measured in the same process -- one batched KV-cache
    rollout plus one forward/backward of the same model on the same batch, no RL bookkeeping --
    goal within 1.5x;
(c) the cost of ``rollout.deterministic: true`` (exact on-policy) vs the default rollout.

Usage: .venv/bin/python benchmarks/sim_step.py [--steps 300] [--threads 1] [--out F.json]
The machine may be shared: run it twice and compare.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from orchestrator import metrics as M
from orchestrator import recipes
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.pools import load_catalog
from orchestrator.sim.config import build_setup
from orchestrator.sim.job import SimTrainer
from orchestrator.sim.local import LocalContext, make_trial
from orchestrator.sim.model import ModelConfig, forward
from orchestrator.sim.task import Task
from orchestrator.sim.trainer import GRPOTrainer, TrainConfig, token_logp

QUICKSTART = {"correction.is_level": "token", "correction.is_mode": "truncate",
              "correction.is_bounds": [0.5, 2.0]}


def config(overrides: dict) -> dict:
    base = recipes.compose_recipe("sim/grpo_tiny", root=recipes.REPO_RECIPES)
    for section, model in (("correction", CorrectionSpec), ("rollout", RolloutSpec)):
        base[section] = {**model().model_dump(mode="json"), **(base.get(section) or {})}
    return recipes.apply_overrides(base, overrides)


def full_trial(steps: int, pool: str) -> tuple[float, float, list[float]]:
    """Wall and CPU seconds of the trial (CPU: what it costs when the machine is shared)."""
    trial = make_trial(pool, steps, 0, QUICKSTART)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = LocalContext(trial=trial, pool=load_catalog().get(pool), workdir=Path(tmp),
                           checkpoint_every=25)
        t0, c0 = time.perf_counter(), time.process_time()
        res = SimTrainer().run(trial, config(QUICKSTART), ctx)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert res.outcome.value == "completed", res
    return wall, cpu, [m[M.TIME_PER_STEP] for m in ctx.metrics.values()]


def trainer_for(overrides: dict, pool: str) -> GRPOTrainer:
    setup = build_setup(config(overrides), load_catalog().get(pool))
    task = Task(**setup.task)
    model = ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model)
    return GRPOTrainer(model, task, TrainConfig(**setup.train), setup.correction,
                       setup.numerics, seed=0)


def step_vs_bare(pool: str, reps: int) -> tuple[float, float]:
    """Median step time and median bare work (rollout + fwd/bwd), interleaved."""
    tr = trainer_for(QUICKSTART, pool)
    cfg, task = tr.cfg, tr.task
    step_t, bare_t = [], []
    for i in range(1, reps + 1):
        t0 = time.perf_counter()
        tr.step(i)  # includes the eval rollout every eval.every steps (the median skips those)
        step_t.append(time.perf_counter() - t0)
        g = torch.Generator().manual_seed(i)
        t0 = time.perf_counter()
        prompts = task.prompts(cfg.prompts_per_step, g).repeat_interleave(cfg.group_size, 0)
        ro = tr.engine.generate(prompts, g)
        out = forward(tr.params, ro.tokens, tr.model)
        (-(token_logp(out.logits, ro.tokens, task.prompt_len) * ro.mask).mean()).backward()
        bare_t.append(time.perf_counter() - t0)
        for p in tr.params.values():
            p.grad = None
    return statistics.median(step_t), statistics.median(bare_t)


def deterministic_ratio(pool: str, reps: int) -> tuple[float, float, float]:
    """Median step and rollout-time ratios, deterministic vs default, steps interleaved so both
    see the same machine load."""
    default = trainer_for(QUICKSTART, pool)
    exact = trainer_for({**QUICKSTART, "rollout.deterministic": True}, pool)
    step = {False: [], True: []}
    gen = {False: [], True: []}
    for i in range(1, reps + 1):
        for det, tr in ((False, default), (True, exact)):
            m = tr.step(i)
            step[det].append(m[M.TIME_PER_STEP])
            gen[det].append(m[M.TIME_GEN])
    med = {k: statistics.median(v) for k, v in step.items()}
    return (med[True] / med[False], statistics.median(gen[True]) / statistics.median(gen[False]),
            med[True])


def main() -> None:
    from orchestrator.sim import numerics

    numerics.ensure_pinned()  # figures hold on every x86-64 AVX2 machine only pinned
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pool", default="sim-h100")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--skip-trial", action="store_true", help="skip (a), the 300-step trial")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    figures: dict[str, float | str | list[float]] = {"pool": args.pool, "threads": args.threads,
                                                     "load_before": list(os.getloadavg())}
    if not args.skip_trial:
        wall, cpu, per_step = full_trial(args.steps, args.pool)
        figures.update(trial_wall_s=wall, trial_cpu_s=cpu, trial_steps=args.steps,
                       trial_median_step_s=statistics.median(per_step))
        print(f"(a) {args.steps}-step quickstart trial on {args.pool}: {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU (median step {statistics.median(per_step) * 1e3:.0f} ms; "
              "goal < 30 s)")
    step, bare = step_vs_bare(args.pool, args.reps)
    figures.update(median_step_s=step, bare_work_s=bare, step_over_bare=step / bare)
    print(f"(b) median step {step * 1e3:.0f} ms vs bare work (KV-cache rollout + fwd/bwd) "
          f"{bare * 1e3:.0f} ms: {step / bare:.2f}x (goal <= 1.5x)")
    ratio, gen_ratio, det = deterministic_ratio(args.pool, max(args.reps // 2, 5))
    figures.update(deterministic_step_ratio=ratio, deterministic_rollout_ratio=gen_ratio,
                   deterministic_step_s=det, load_after=list(os.getloadavg()))
    print(f"(c) rollout.deterministic: true costs {ratio:.1f}x the default step "
          f"({det * 1e3:.0f} ms/step; rollout alone {gen_ratio:.1f}x): a full fp32 forward at "
          "the trainer's shape per generated token instead of the KV cache")
    print(f"load average before/after: {figures['load_before']} / {figures['load_after']}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
