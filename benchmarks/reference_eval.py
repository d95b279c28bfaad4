"""Overhead of the reference evaluator (``eval: {reference: trainer}``) on the quickstart grid
(a benchmark, not a test). Goal: at most 10% of a trial's time on the simulator.

Every trial of ``grids/quickstart.yaml`` runs twice in this process, without and with the
reference, in both orders across the grid (even trials baseline first, odd trials reference
first; ``--abba``: every trial in both orders), all 120 steps (no early stop), 1 thread, pinned
numerics, checkpoints every 20 steps as the grid sets. Prints per trial the wall seconds of
each run and their ratio, and the reference's own measured time (``timing_s/eval_ref``) as a
share of the reference run: the figure a shared machine's noise touches least. It also checks
that each pair's own metrics are equal bit for bit (the reference changes none of them).

Usage: .venv/bin/python benchmarks/reference_eval.py [--trials N] [--stride K] [--abba] [--steps N]
       [--out F.json]
The machine may be shared: run it twice and compare.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator import recipes
from orchestrator.grid import expand, load_grid
from orchestrator.sim import numerics
from orchestrator.sim.job import SimTrainer
from orchestrator.sim.local import LocalContext

GRID = Path(__file__).resolve().parents[1] / "grids" / "quickstart.yaml"
TIMING = ("perf/", "timing_s/")


def run(trial: Any, config: dict[str, Any], pool: Any, every: int) -> tuple[float, float, dict]:
    """Wall and CPU seconds of one trial (CPU: what a shared machine's load disturbs least)."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = LocalContext(trial=trial, pool=pool, workdir=Path(tmp), checkpoint_every=every)
        t0, c0 = time.perf_counter(), time.process_time()
        res = SimTrainer().run(trial, config, ctx)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert res.last_step > 0, res
    return wall, cpu, ctx.metrics


def own(metrics: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {s: {k: v for k, v in m.items() if not k.startswith(TIMING) and k != M.EVAL_REWARD_REF}
            for s, m in metrics.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=0, help="first N trials only (0: all)")
    ap.add_argument("--stride", type=int, default=1,
                    help="every K-th trial of the grid (3: both pools, every correction)")
    ap.add_argument("--abba", action="store_true", help="every trial in both orders")
    ap.add_argument("--steps", type=int, default=0,
                    help="run each trial this many steps instead of the grid's (a quick look)")
    ap.add_argument("--out")
    args = ap.parse_args()
    numerics.ensure_pinned()  # the numbers (and the bit-identity check) hold only pinned
    grid = load_grid(GRID)
    trials = expand(grid)[:: args.stride][: args.trials or None]
    every = grid.spec.checkpoint.every
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for i, trial in enumerate(trials):
        if args.steps:
            trial = dataclasses.replace(trial, steps=args.steps)
        # The quickstart grid scores with the reference itself: the baseline drops it.
        base_cfg = copy.deepcopy(dict(grid.trial_config(trial)))
        (base_cfg.get("eval") or {}).pop("reference", None)
        ref_cfg = recipes.apply_overrides(base_cfg, {"eval.reference": "trainer"})
        pool = grid.pools.get(trial.pool)
        orders = [["base", "ref"], ["ref", "base"]] if args.abba else [
            ["base", "ref"] if i % 2 == 0 else ["ref", "base"]]
        walls: dict[str, list[float]] = {"base": [], "ref": []}
        cpus: dict[str, list[float]] = {"base": [], "ref": []}
        out: dict[str, dict] = {}
        for order in orders:
            for kind in order:
                wall, cpu, metrics = run(trial, base_cfg if kind == "base" else ref_cfg, pool,
                                         every)
                walls[kind].append(wall)
                cpus[kind].append(cpu)
                out[kind] = metrics
        assert own(out["base"]) == own(out["ref"]), f"{trial.trial_id}: own metrics differ"
        ref_s = sum(m.get(M.TIME_EVAL_REF, 0.0) for m in out["ref"].values())
        b, r = statistics.fmean(walls["base"]), statistics.fmean(walls["ref"])
        rows.append({"trial": trial.trial_id, "cell": dict(trial.axes), "seed": trial.seed,
                     "order": " / ".join("-".join(o) for o in orders), "base_s": b, "ref_s": r,
                     "ratio": r / b, "eval_ref_s": ref_s, "eval_ref_share": ref_s / r,
                     "base_cpu_s": statistics.fmean(cpus["base"]),
                     "ref_cpu_s": statistics.fmean(cpus["ref"])})
        print(f"{trial.trial_id} {trial.axes} seed {trial.seed} [{rows[-1]['order']}]: "
              f"base {b:.1f}s, with reference {r:.1f}s ({r / b - 1:+.1%}; CPU "
              f"{rows[-1]['ref_cpu_s'] / rows[-1]['base_cpu_s'] - 1:+.1%}); reference eval "
              f"{ref_s:.2f}s = {ref_s / r:.1%} of the trial", flush=True)
        summary = summarise(rows, args)
        if args.out:  # after every trial: an interrupted run keeps what it measured
            Path(args.out).write_text(json.dumps({"summary": summary, "trials": rows}, indent=1))
    print(f"grid: {summary['trials']} trials, base {summary['base_s']:.1f}s, with reference "
          f"{summary['ref_s']:.1f}s ({summary['wall_overhead']:+.1%} wall, "
          f"{summary['cpu_overhead']:+.1%} CPU; median trial "
          f"{summary['median_trial_overhead']:+.1%}); reference eval {summary['eval_ref_share']:.1%} "
          "of the reference runs' time (goal <= 10%); own metrics identical in every pair")


def summarise(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    base = sum(x["base_s"] for x in rows)
    ref = sum(x["ref_s"] for x in rows)
    share = sum(x["eval_ref_s"] for x in rows) / ref
    return {"trials": len(rows), "steps": args.steps or None, "base_s": base, "ref_s": ref,
            "wall_overhead": ref / base - 1, "eval_ref_share": share,
            "cpu_overhead": (sum(x.get("ref_cpu_s", math.nan) for x in rows)
                             / sum(x.get("base_cpu_s", math.nan) for x in rows) - 1),
            "median_trial_overhead": statistics.median(x["ratio"] - 1 for x in rows),
            "goal": 0.10, "own_metrics_identical": True,
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg())}


if __name__ == "__main__":
    main()
