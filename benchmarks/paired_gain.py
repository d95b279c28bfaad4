"""How much narrower a paired comparison of final reward is than Welch's, on recorded trials.

For every comparison of a correction with ``none`` (same pool and other axes) over the seeds both
arms ran: the width of the paired t interval over the width of Welch's interval, and both p-values
(``orchestrator.stats.intervals``, ``orchestrator.stats.hypotheses``). Reads ``results/findings/trials.csv``
and ``results/quickstart/trials.csv`` (committed), and optionally the adaptive-seeds benchmark's
cache of recorded sim trials (``--cache``: 10 seeds per cell).

    .venv/bin/python benchmarks/paired_gain.py [--cache DIR --grid benchmarks/adaptive_seeds_collapse.yaml]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SOURCES = [("findings", REPO / "results/findings/trials.csv", ["arch", "pool", "engine"], "corr", "final_eval"),
           ("quickstart", REPO / "results/quickstart/trials.csv", ["pool"], "correction", "final_reward")]


def compare_arms(name: str, groups: dict[tuple, dict[str, dict[int, float]]]) -> list[dict[str, Any]]:
    """Paired vs Welch for each (context, arm vs none) over the shared seeds."""
    from orchestrator.stats.hypotheses import p_from_interval
    from orchestrator.stats.intervals import mean_difference, paired_difference

    rows = []
    for ctx, arms in groups.items():
        base = arms.get("none")
        if base is None:
            continue
        for arm, vals in arms.items():
            seeds = sorted(set(vals) & set(base))
            if arm == "none" or len(seeds) < 2:
                continue
            a, b = [vals[s] for s in seeds], [base[s] for s in seeds]
            pairs = list(zip(a, b))
            w = mean_difference(a, b).width
            pw = paired_difference(pairs).width
            rows.append({"source": name, "context": ctx, "arm": arm, "seeds": len(seeds),
                         "width_ratio": pw / w,
                         "p_welch": p_from_interval(lambda lv, a=a, b=b: mean_difference(a, b, lv)),
                         "p_paired": p_from_interval(lambda lv, p=pairs: paired_difference(p, lv))})
    return rows


def from_csv(name: str, path: Path, ctx: list[str], arm: str, y: str) -> list[dict[str, Any]]:
    import pandas as pd

    d = pd.read_csv(path)
    d = d[d["derived_from"].isna()]
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    for _, r in d.iterrows():
        groups.setdefault(tuple(r[c] for c in ctx), {}).setdefault(r[arm], {})[int(r["seed"])] = float(r[y])
    return compare_arms(name, groups)


def from_cache(cache: Path, grid: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import adaptive_seeds as A

    cells = A.outcomes(grid, A.ground_truth(grid, cache, 1))
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    for cell, outs in cells.items():
        label = dict(cell)
        arm = label.pop("correction")
        groups.setdefault(tuple(label.items()), {})[arm] = {o.seed: o.reward for o in outs}
    return compare_arms(f"cache {grid.name}", groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--grid", type=Path, default=REPO / "benchmarks" / "adaptive_seeds_collapse.yaml")
    args = ap.parse_args()
    rows = [r for src in SOURCES for r in from_csv(*src)]
    if args.cache:
        rows += from_cache(args.cache, args.grid)
    for r in rows:
        print(f"{r['source']:>12} {r['context']!s:<45} {r['arm']:>10} n={r['seeds']:>2} "
              f"paired/Welch width {r['width_ratio']:.2f}  p Welch {r['p_welch']:.3g}  paired {r['p_paired']:.3g}")
    for src in dict.fromkeys(r["source"] for r in rows):
        ratios = [r["width_ratio"] for r in rows if r["source"] == src]
        print(f"{src}: median width ratio {statistics.median(ratios):.2f} over {len(ratios)} comparisons")
    ratios = [r["width_ratio"] for r in rows]
    print(f"all: median width ratio {statistics.median(ratios):.2f} over {len(ratios)} comparisons")


if __name__ == "__main__":
    main()
