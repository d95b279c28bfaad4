"""Adaptive seeds vs a fixed number of seeds per cell, on the CPU simulator, against a ground truth.

The grid (``benchmarks/adaptive_seeds_grid.yaml``: four learning rates, each compared with the
recipe's 5e-4 on the final eval reward) runs every cell to the adaptive block's ``max`` seeds
once: that is the ground truth (a comparison is decided there when its p-value, adjusted over the
grid's comparisons with Holm, is below 0.05; ``orchestrator.stats.seeds.comparisons``). ``--target``
replays the same recorded trials on another target (``time_to_collapse`` on
``benchmarks/adaptive_seeds_collapse.yaml``: the log-rank test, RMST widths). Trials run in this machine's processes (``SimTrainer``, two at a time, pinned numerics) and
are cached by trial id under ``--cache``; their cost is the trial process's CPU time in
CPU-hours (on a shared machine the wall time measures the neighbours' load, the CPU time the
trial).

Both arms are then replayed on those recorded trials, in seed order, so they see exactly the
outcomes a live run would have produced (a trial's result depends only on its configuration and
seed; the scheduler's adaptive seed ``n`` is the same content-hashed trial as listed seed ``n``):

- adaptive: every cell starts with ``min`` seeds, then ``orchestrator.stats.seeds.needs_seed`` (the
  code the scheduler runs) picks the next cell after each finished trial, one at a time, until no
  cell needs one;
- fixed: every cell gets seeds ``0..n-1``, for each ``n`` from ``min`` to ``max``.

Figures: comparisons decided correctly (same direction as the ground truth's decided interval),
decisions the ground truth contradicts (decided the other way, or decided where the ground truth
is not), the cost of each arm, the fixed arm at the adaptive arm's cost, and the cheapest fixed
``n`` that decides as many comparisons correctly as the adaptive arm (the cost ratio; goal <= 0.6).
The same replay is repeated over the ``max`` cyclic rotations of the seed order (seeds are
arbitrary labels, so each rotation is an equally valid order) to show the result is not one
lucky order.

    .venv/bin/python benchmarks/adaptive_seeds.py [--grid G] [--target T] [--cache DIR] [--workers 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "benchmarks" / "adaptive_seeds_grid.yaml"


def _run_one(args: tuple[str, str, str]) -> str:
    """Run one trial of the grid to its end in this process and cache its history and cost."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.sim.job import SimTrainer
    from orchestrator.sim.local import LocalContext

    grid_file, cache, tid = args
    path = Path(cache) / f"{tid}.json"
    if path.exists():
        return tid
    grid = load_grid(grid_file)
    trial = next(t for t in expand(grid) if t.trial_id == tid)
    t0, c0 = time.time(), time.process_time()
    ctx = LocalContext(trial=trial, pool=grid.pools.get(trial.pool), workdir=Path(cache) / "work" / tid)
    result = SimTrainer().run(trial, grid.trial_config(trial), ctx)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"outcome": result.outcome.value, "wall_s": time.time() - t0,
                               "cpu_s": time.process_time() - c0, "history": sorted(ctx.metrics.items())}))
    tmp.rename(path)
    print(f"  ran {dict(trial.axes)} seed {trial.seed}: {time.time() - t0:.0f} s wall, "
          f"{time.process_time() - c0:.1f} s CPU", file=sys.stderr, flush=True)
    return tid


def ground_truth(grid_file: Path, cache: Path, workers: int) -> dict[str, dict[str, Any]]:
    """Every trial of the grid at ``max`` seeds, run (or read from ``cache``), by trial id."""
    import multiprocessing

    from orchestrator.grid import expand, load_grid

    trials = sorted(expand(load_grid(grid_file)), key=lambda t: (t.seed, t.axes))
    cache.mkdir(parents=True, exist_ok=True)
    todo = [(str(grid_file), str(cache), t.trial_id) for t in trials
            if not (cache / f"{t.trial_id}.json").exists()]
    if todo:
        print(f"running {len(todo)} of {len(trials)} trials ({workers} at a time)", file=sys.stderr)
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            list(pool.imap_unordered(_run_one, todo))
    return {t.trial_id: json.loads((cache / f"{t.trial_id}.json").read_text()) for t in trials}


def outcomes(grid_file: Path, recorded: Mapping[str, Mapping[str, Any]]) -> dict[tuple, list[Any]]:
    """Per cell, its trials' outcomes in seed order (verdict, final eval reward, CPU-hours)."""
    from orchestrator import metrics as M
    from orchestrator.grid import expand, load_grid
    from orchestrator.stats.seeds import Outcome
    from orchestrator.verdict import judge

    grid = load_grid(grid_file)
    cells: dict[tuple, list[Any]] = {}
    for t in sorted(expand(grid), key=lambda t: t.seed):
        rec = recorded[t.trial_id]
        history = [(int(s), m) for s, m in rec["history"]]
        verdict = judge(history, grid.spec.collapse, total_steps=t.steps,
                        outcome="completed" if rec["outcome"] == "completed" else "stopped")
        evals = [m[M.EVAL_REWARD] for _, m in history if M.EVAL_REWARD in m]
        collapsed = None if verdict.kind.value == "infra_failure" else \
            verdict.kind.value in ("collapsed", "numeric_failure")
        last = history[-1][0] if history else 0
        step = verdict.step if collapsed and verdict.step is not None else last
        cells.setdefault(t.axes, []).append(Outcome(t.seed, collapsed, evals[-1] if evals else math.nan,
                                                    rec["cpu_s"] / 3600, step))
    return cells


TARGET: list[str] = []  # ``--target``: replay on this target instead of the grid's


def adaptive_spec(grid: Any) -> Any:
    """The grid's adaptive block, with ``--target`` applied."""
    ad = grid.spec.adaptive
    return ad.model_copy(update={"target": TARGET[0]}) if TARGET else ad


def comps_of(cells: Mapping[tuple, Sequence[Any]], grid: Any) -> list[Any]:
    """The grid's declared comparisons on its target, as the scheduler computes them."""
    from orchestrator.grid import axis_label
    from orchestrator.stats.seeds import comparisons

    ad = adaptive_spec(grid)
    return comparisons(cells, grid.spec.comparisons, ad.target, ad.level, label=axis_label,
                       horizon=grid.spec.steps, multiplicity=grid.spec.multiplicity)


def decisions(cells: Mapping[tuple, Sequence[Any]], grid: Any) -> dict[tuple, int]:
    """Per comparison (cell, baseline): +1 / -1 when decided (sign of the difference), 0 if not."""
    out = {}
    for c in comps_of(cells, grid):
        out[(c.cell, c.base_cell)] = 0 if not c.decided else (1 if c.diff.estimate > 0 else -1)
    return out


def score(got: Mapping[tuple, int], truth: Mapping[tuple, int]) -> dict[str, int]:
    correct = sum(1 for k, v in got.items() if v != 0 and v == truth[k])
    contradicted = sum(1 for k, v in got.items() if v != 0 and v != truth[k])
    return {"decided": sum(1 for v in got.values() if v), "correct": correct, "contradicted": contradicted}


def adaptive_arm(cells: Mapping[tuple, Sequence[Any]], grid: Any) -> tuple[dict[tuple, list[Any]], int]:
    """Replay the scheduler's allocation one finished trial at a time; (cells as run, trials)."""
    from orchestrator.stats.seeds import needs_seed

    ad = adaptive_spec(grid)
    run = {k: list(v[:ad.min]) for k, v in cells.items()}
    while True:
        comps = comps_of(run, grid)
        order = needs_seed(run, ad, comps, {k: len(v) for k, v in run.items()}, grid.spec.steps)
        if not order:
            return run, sum(len(v) for v in run.values())
        cell = order[0]
        run[cell].append(cells[cell][len(run[cell])])


def _cost(cells: Mapping[tuple, Sequence[Any]]) -> float:
    return sum(o.hours for v in cells.values() for o in v)


def replay(cells: Mapping[tuple, Sequence[Any]], grid: Any) -> dict[str, Any]:
    """Both arms on one seed order."""
    from orchestrator.stats.seeds import cell_text

    ad = adaptive_spec(grid)
    truth = decisions(cells, grid)
    adaptive, n_trials = adaptive_arm(cells, grid)
    a = {**score(decisions(adaptive, grid), truth), "trials": n_trials, "cost_h": _cost(adaptive),
         "seeds_per_cell": {cell_text(k): len(v) for k, v in adaptive.items()}}
    fixed = []
    for n in range(ad.min, ad.max + 1):
        run = {k: list(v[:n]) for k, v in cells.items()}
        fixed.append({"seeds": n, **score(decisions(run, grid), truth), "trials": n * len(cells),
                      "cost_h": _cost(run)})
    same_cost = min(fixed, key=lambda f: abs(f["cost_h"] - a["cost_h"]))
    enough = next((f for f in fixed if f["correct"] >= a["correct"]), None)
    return {"adaptive": a, "fixed": fixed, "fixed_at_adaptive_cost": same_cost,
            "fixed_to_match": enough,
            "cost_ratio": a["cost_h"] / enough["cost_h"] if enough else None}


def rotated(cells: Mapping[tuple, Sequence[Any]], r: int) -> dict[tuple, list[Any]]:
    return {k: list(v[r:]) + list(v[:r]) for k, v in cells.items()}


def report(res: Mapping[str, Any]) -> None:
    gt, a = res["ground_truth"], res["seed_order"]["adaptive"]
    print(f"grid {res['grid']}: {res['cells']} cells x {res['max_seeds']} seeds, target {res['target']}, "
          f"ci_width {res['ci_width']}, min {res['min_seeds']}")
    print(f"ground truth ({res['max_seeds']} seeds per cell, {gt['cost_h'] * 3600:.0f} CPU-s): "
          f"{gt['decided']} of {gt['comparisons']} comparisons decided")
    for row in gt["rows"]:
        print(f"  {row['comparison']}: {row['difference']:+.4f} [{row['low']:+.4f}, {row['high']:+.4f}] "
              f"{'decided' if row['decided'] else 'undecided'}")
    print("seed order 0..max-1:")
    print(f"  adaptive: {a['trials']} trials, {a['cost_h'] * 3600:.0f} CPU-s, decided {a['decided']}, "
          f"correct {a['correct']}, contradicted {a['contradicted']}; seeds per cell {a['seeds_per_cell']}")
    for f in res["seed_order"]["fixed"]:
        print(f"  fixed {f['seeds']:>2} seeds/cell: {f['trials']:>3} trials, {f['cost_h'] * 3600:5.0f} CPU-s, "
              f"decided {f['decided']}, correct {f['correct']}, contradicted {f['contradicted']}")
    s, m = res["seed_order"]["fixed_at_adaptive_cost"], res["seed_order"]["fixed_to_match"]
    print(f"  at the adaptive arm's cost the fixed arm ({s['seeds']} seeds/cell) decides {s['correct']} correctly")
    if m:
        print(f"  fixed needs {m['seeds']} seeds/cell ({m['cost_h'] * 3600:.0f} CPU-s) to decide as many "
              f"correctly: adaptive costs {res['seed_order']['cost_ratio']:.0%} of that")
    rot = res["rotations"]
    print(f"over {rot['n']} rotations of the seed order: adaptive correct {rot['adaptive_correct']} "
          f"(min {rot['adaptive_correct_min']}), contradicted {rot['contradicted_total']} in total; "
          f"cost ratio to the matching fixed arm median {rot['cost_ratio_median']:.0%}, "
          f"max {rot['cost_ratio_max']:.0%}; rotations where no fixed n matched: {rot['unmatched']}")


def main() -> None:
    from orchestrator.sim import numerics

    numerics.ensure_pinned()  # the recorded trials are reproducible on any x86-64 AVX2 machine
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=GRID)
    ap.add_argument("--target", choices=["collapse_rate", "final_reward", "time_to_collapse"],
                    help="replay on this target instead of the grid's (same recorded trials)")
    ap.add_argument("--cache", type=Path, default=REPO / ".ablate" / "bench-adaptive-seeds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=REPO / "results" / "benchmarks" / "adaptive_seeds.json")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from orchestrator.grid import load_grid
    from orchestrator.stats.seeds import cell_text

    grid = load_grid(args.grid)
    if args.target:
        TARGET.append(args.target)
    ad = adaptive_spec(grid)
    t0 = time.time()
    cells = outcomes(args.grid, ground_truth(args.grid, args.cache, args.workers))
    run_s = time.time() - t0
    comps = comps_of(cells, grid)
    main_order = replay(cells, grid)
    rots = [replay(rotated(cells, r), grid) for r in range(ad.max)]
    ratios = [r["cost_ratio"] for r in rots if r["cost_ratio"] is not None]
    res = {
        "grid": grid.name, "grid_file": str(args.grid.relative_to(REPO)) if args.grid.is_relative_to(REPO) else str(args.grid),
        "cells": len(cells), "max_seeds": ad.max, "min_seeds": ad.min, "target": ad.target,
        "ci_width": ad.ci_width, "level": ad.level, "cost_unit": "cpu_hours (trial process CPU time)",
        "multiplicity": grid.spec.multiplicity, "horizon_steps": grid.spec.steps,
        "ground_truth": {"comparisons": len(comps), "decided": sum(c.decided for c in comps),
                         "cost_h": _cost(cells),
                         "rows": [{"comparison": f"{cell_text(c.cell)} vs {c.baseline}", "difference": c.diff.estimate,
                                   "low": c.diff.low, "high": c.diff.high, "p_value": c.p_value,
                                   "p_adjusted": c.p_adjusted, "decided": c.decided} for c in comps]},
        "load_average": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "seed_order": main_order,
        "rotations": {"n": len(rots),
                      "adaptive_correct": statistics.fmean(r["adaptive"]["correct"] for r in rots),
                      "adaptive_correct_min": min(r["adaptive"]["correct"] for r in rots),
                      "contradicted_total": sum(r["adaptive"]["contradicted"] for r in rots),
                      "cost_ratio_median": statistics.median(ratios) if ratios else math.nan,
                      "cost_ratio_max": max(ratios) if ratios else math.nan,
                      "unmatched": sum(1 for r in rots if r["cost_ratio"] is None),
                      "per_rotation": [{"rotation": i, "adaptive_trials": r["adaptive"]["trials"],
                                        "adaptive_correct": r["adaptive"]["correct"],
                                        "contradicted": r["adaptive"]["contradicted"],
                                        "cost_ratio": r["cost_ratio"]} for i, r in enumerate(rots)]},
        "ground_truth_run_s": round(run_s, 1),
    }
    report(res)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
