"""Per-pool mismatch table of the simulator (the figures in orchestrator/sim/README.md).

For each ``sim-*`` pool and model architecture: a full trial with no correction, reporting the
k3 KL (median over the run, median over its learning phase and its maximum), the final and peak
held-out eval reward and the final entropy. Usage:

    .venv/bin/python benchmarks/sim_calibration.py [--arch dense moe] [--steps 300] [--seed 0] \\
        [--out results/benchmarks/sim_calibration.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from orchestrator import metrics as M
from orchestrator.pools import load_catalog
from orchestrator.sim.job import SimTrainer
from orchestrator.sim.local import LocalContext, make_trial

POOLS = ("sim-h20", "sim-h100", "sim-l20", "sim-a100")


def one(pool: str, arch: str, steps: int, seed: int) -> dict[str, float | str]:
    from benchmarks.sim_step import config  # same recipe composition as the benchmark

    over = {"model.arch": arch}
    trial = make_trial(pool, steps, seed, over)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = LocalContext(trial=trial, pool=load_catalog().get(pool), workdir=Path(tmp))
        t0 = time.perf_counter()
        res = SimTrainer().run(trial, config(over), ctx)
        wall = time.perf_counter() - t0
    k3 = [m[M.K3_KL] for m in ctx.metrics.values()]
    ent = [m[M.ENTROPY] for m in ctx.metrics.values()]
    # Learning phase: steps whose policy entropy is between 0.5 and 2.5 nats (not uniform yet
    # not collapsed), where the mismatch of a real policy lives.
    learning = [k for k, e in zip(k3, ent) if 0.5 <= e <= 2.5] or k3
    evals = [m[M.EVAL_REWARD] for m in ctx.metrics.values() if M.EVAL_REWARD in m]
    return {"pool": pool, "arch": arch, "outcome": res.outcome.value,
            "k3_median": statistics.median(k3), "k3_learning": statistics.median(learning),
            "k3_max": max(k3), "eval_final": evals[-1], "eval_peak": max(evals),
            "entropy_final": ent[-1], "wall_s": wall}


def main() -> None:
    from orchestrator.sim import numerics

    numerics.ensure_pinned()  # figures hold on every x86-64 AVX2 machine only pinned
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["dense", "moe"])
    ap.add_argument("--pools", nargs="+", default=list(POOLS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as a JSON list")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for arch in args.arch:
        for pool in args.pools:
            rows.append(one(pool, arch, args.steps, args.seed))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
