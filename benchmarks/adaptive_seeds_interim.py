"""Design study: would interim looks on running trials bring adaptive seeds to <= 0.6x the fixed arm?

**The scheduler does not run this policy**; this replay measures whether it is worth building.
On the recorded trials of ``benchmarks/adaptive_seeds.py --grid benchmarks/adaptive_seeds_collapse.yaml``
(read from its ``--cache``; run that first), target the time to collapse:

- trials run on the pool's slots (``capacity``, 2 for sim-a100), all at the same pace; every
  ``--every`` steps the comparison is *looked at* on partial data: a running trial whose collapse
  an online monitor has seen (the verdict engine with early stop at margin 0: the step its
  collapse rule holds) is an event at the collapse's onset step, any other running trial is
  censored at the step it has reached; finished trials as in ``ablate compare``;
- the first ``min`` seeds of every cell start first; a freed slot goes to the cell of an
  undecided comparison with the fewest seeds started (the shared baseline first on a tie);
- once every comparison is decided, running trials are stopped; the cost is each trial's CPU
  time per step x the steps it ran;
- decisions: ``nominal``: the log-rank p-values, Holm-adjusted, below 0.05 at the current look
  (no control of the error across looks, the best case); ``spending``: a comparison is decided
  the first time its log-rank |Z| crosses the Lan-DeMets O'Brien-Fleming boundary
  (``orchestrator.stats.sequential``) at information fraction = (steps observed in the two cells) /
  (2 x max x steps), with Holm's levels recycled as comparisons are decided (the graphical
  approach of Maurer and Bretz, 2013);
- a decision's direction is the sign of the RMST difference at the stop (the ground truth at
  10 seeds per cell: every correction collapses later than none, ``adaptive_seeds.py``);
- the fixed arm: ``n`` seeds per cell run to the end, the smallest ``n`` whose Holm-adjusted
  log-rank tests decide every comparison (chosen with hindsight, as in ``adaptive_seeds.py``).

``--slots`` repeats both replays with more slots than the pool has (``slots`` in the JSON: each
count's median and max), since a look mid-way holds as many part-run trials as there are slots.

**A bound for any policy** (``oracle`` in the JSON): per rotation, the cheapest run chosen with
hindsight among every choice of a seed count per cell (the first ``n_c`` seeds of cell ``c``,
``min`` to ``max``) and of one horizon for all trials (40 steps to ``steps`` by 10, a trial
censored there), such that the Holm-adjusted log-rank tests at 0.05 decide every comparison (no
control of the error across looks: the best case). No policy that allocates seeds in this order
and runs its trials to a common horizon can cost less under the same test; ``stop_at_collapse``
repeats it (and the fixed arm) with every trial stopped at the step its collapse is seen.

    .venv/bin/python benchmarks/adaptive_seeds_interim.py --cache DIR [--every 10] [--slots 8 20] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "benchmarks" / "adaptive_seeds_collapse.yaml"
ALPHA = 0.05

# A recorded trial: (step its collapse is seen, or None; its onset step; CPU-s per step; steps).
Trial = tuple[int | None, int | None, float, int]


def recorded(grid: Any, cache: Path) -> dict[tuple, list[Trial]]:
    """Per cell, its recorded trials in seed order."""
    from orchestrator.grid import expand
    from orchestrator.schema import EarlyStopSpec
    from orchestrator.verdict import VerdictEngine, judge

    cells: dict[tuple, list[Trial]] = {}
    for t in sorted(expand(grid), key=lambda t: t.seed):
        path = cache / f"{t.trial_id}.json"
        if not path.exists():
            sys.exit(f"error: {path} missing; run benchmarks/adaptive_seeds.py --grid {GRID} --cache {cache} first")
        rec = json.loads(path.read_text())
        hist = [(int(s), m) for s, m in rec["history"]]
        full = judge(hist, grid.spec.collapse, total_steps=t.steps)
        seen = None
        if full.kind.value in ("collapsed", "numeric_failure"):
            engine = VerdictEngine(grid.spec.collapse, EarlyStopSpec(enabled=True, margin=0), t.steps)
            seen = next((s for s, row in hist if engine.observe(s, row)), hist[-1][0])
        cells.setdefault(t.axes, []).append((seen, full.step if seen else None, rec["cpu_s"] / len(hist), len(hist)))
    return cells


def observed(runs: Sequence[tuple[Trial, int]], now: int) -> list[Any]:
    """The trials started at ``runs``' times, as survival data at time ``now``."""
    from orchestrator.stats.survival import Observation

    out = []
    for (seen, onset, _, steps), start in runs:
        ran = min(now - start, steps)
        if seen is not None and seen <= ran:
            out.append(Observation(float(onset), True))  # type: ignore[arg-type]
        elif ran > 0:
            out.append(Observation(float(ran), False))
    return out


class Decider:
    """Which comparisons are decided after each look (``nominal`` or ``spending``)."""

    def __init__(self, names: Sequence[Any], mode: str) -> None:
        self.mode, self.names = mode, list(names)
        self.looks: dict[Any, list[tuple[float, float]]] = {k: [] for k in names}
        self.bounds: dict[tuple[Any, float], Any] = {}

    def look(self, p: Mapping[Any, float], fraction: Mapping[Any, float]) -> set[Any]:
        from orchestrator.stats import hypotheses

        if self.mode == "nominal":
            adj = hypotheses.adjust([p[k] for k in self.names], "holm")
            return {k for k, a in zip(self.names, adj) if a < ALPHA}
        for k in self.names:
            if not self.looks[k] or fraction[k] > self.looks[k][-1][0]:
                self.looks[k].append((fraction[k], p[k]))
        rejected: set[Any] = set()
        while True:  # Holm, recycled: a decided comparison's level goes to the others
            left = [k for k in self.names if k not in rejected]
            new = {k for k in left if self._crossed(k, ALPHA / len(left))} if left else set()
            if not new:
                return rejected
            rejected |= new

    def _crossed(self, k: Any, level: float) -> bool:
        from orchestrator.stats.sequential import Boundaries, z_of_p

        b = self.bounds.setdefault((k, level), Boundaries(level))
        while len(b.values) < len(self.looks[k]):
            b.add(self.looks[k][len(b.values)][0])
        return any(z_of_p(p) >= c for (_, p), c in zip(self.looks[k], b.values))


def replay(cells: Mapping[tuple, Sequence[Trial]], base: tuple, spec: Any, mode: str,
           slots: int, every: int, horizon: int) -> dict[str, Any]:
    """One run of the interim-look policy; its decisions, cost and seeds per cell."""
    from orchestrator.stats.survival import logrank_p, rmst_difference

    others = [k for k in cells if k != base]
    started = {k: 0 for k in cells}
    runs: dict[tuple, list[tuple[Trial, int]]] = {k: [] for k in cells}
    queue = [k for _ in range(spec.min) for k in [base, *others]]
    running: list[tuple[tuple, int, int]] = []
    decider, decided, now = Decider(others, mode), set(), 0
    while len(decided) < len(others):
        while len(running) < slots:
            if queue:
                cell = queue.pop(0)
            else:
                open_ = [k for k in others if k not in decided]
                cand = [c for c in [base, *open_] if open_ and started[c] < spec.max]
                if not cand:
                    break
                cell = min(cand, key=lambda c: (started[c], c != base))
            runs[cell].append((cells[cell][started[cell]], now))
            running.append((cell, started[cell], now))
            started[cell] += 1
        if not running:
            break
        now += every
        running = [(c, i, s) for c, i, s in running if now - s < cells[c][i][3]]
        base_obs = observed(runs[base], now)
        p, frac = {}, {}
        for k in others:
            obs = observed(runs[k], now)
            p[k] = logrank_p(obs, base_obs) if obs and base_obs else 1.0
            p[k] = 1.0 if not math.isfinite(p[k]) else p[k]
            frac[k] = (sum(o.time for o in obs) + sum(o.time for o in base_obs)) / (2 * spec.max * horizon)
        decided = decider.look(p, frac)
    cost = sum(tr[2] * min(now - start, tr[3]) for rs in runs.values() for tr, start in rs)
    # A decision's direction: the sign of the RMST difference on the data it was taken on.
    signs = {k: rmst_difference(observed(runs[k], now), observed(runs[base], now), horizon).estimate > 0
             for k in decided}
    return {"decided": len(decided), "later": sum(signs.values()), "cpu_s": cost, "last_step": now,
            "seeds_per_cell": {",".join(f"{a}={v}" for a, v in k): len(v) for k, v in runs.items()}}


def fixed_arm(cells: Mapping[tuple, Sequence[Trial]], base: tuple, spec: Any) -> tuple[int | None, float]:
    """The smallest n deciding every comparison (Holm, log-rank on full trials) and its CPU-s."""
    from orchestrator.stats import hypotheses
    from orchestrator.stats.survival import logrank_p

    others = [k for k in cells if k != base]
    for n in range(spec.min, spec.max + 1):
        whole = {k: observed([(t, 0) for t in v[:n]], 10**9) for k, v in cells.items()}
        adj = hypotheses.adjust([logrank_p(whole[k], whole[base]) for k in others], "holm")
        if all(a < ALPHA for a in adj):
            return n, sum(t[2] * t[3] for v in cells.values() for t in v[:n])
    return None, math.nan


def stopped_at_collapse(cells: Mapping[tuple, Sequence[Trial]]) -> dict[tuple, list[Trial]]:
    """The same trials, each ending at the step its collapse is seen (the rest run to the end)."""
    return {k: [(seen, onset, cpu, seen if seen is not None else steps) for seen, onset, cpu, steps in v]
            for k, v in cells.items()}


def oracle(cells: Mapping[tuple, Sequence[Trial]], base: tuple, spec: Any, horizon: int) -> dict[str, Any]:
    """The cheapest seed counts per cell and common horizon that decide every comparison (see the
    module docstring), chosen with hindsight; its cost, counts and horizon."""
    import itertools

    from orchestrator.stats import hypotheses
    from orchestrator.stats.survival import logrank_p

    others = [k for k in cells if k != base]
    counts = range(spec.min, spec.max + 1)

    def cost(trials: Sequence[Trial], h: int) -> float:
        return sum(cpu * min(h, steps) for _, _, cpu, steps in trials)

    best: dict[str, Any] = {"cpu_s": math.inf}
    for h in range(min(40, horizon), horizon + 1, 10):
        c_other = {k: {m: cost(cells[k][:m], h) for m in counts} for k in others}
        for n0 in counts:
            b = observed([(t, 0) for t in cells[base][:n0]], h)
            p = {k: {m: logrank_p(observed([(t, 0) for t in cells[k][:m]], h), b) for m in counts} for k in others}
            for ms in itertools.product(counts, repeat=len(others)):
                c = cost(cells[base][:n0], h) + sum(c_other[k][m] for k, m in zip(others, ms))
                if c >= best["cpu_s"]:
                    continue
                ps = [p[k][m] if math.isfinite(p[k][m]) else 1.0 for k, m in zip(others, ms)]
                if all(a < ALPHA for a in hypotheses.adjust(ps, "holm")):
                    best = {"cpu_s": c, "horizon": h, "seeds_per_cell": {
                        ",".join(f"{a}={v}" for a, v in k): m for k, m in zip([base, *others], [n0, *ms])}}
    return best


def rotated(cells: Mapping[tuple, Sequence[Trial]], r: int) -> dict[tuple, list[Trial]]:
    """Every cell's trials in the seed order that starts at its ``r``-th seed."""
    return {k: list(v[r:]) + list(v[:r]) for k, v in cells.items()}


def replay_rotations(cells: Mapping[tuple, Sequence[Trial]], base: tuple, spec: Any, mode: str,
                     slots: int, every: int, horizon: int) -> list[dict[str, Any]]:
    """``replay`` on each rotation of the seed order against that rotation's fixed arm."""
    rows = []
    for r in range(spec.max):
        rot = rotated(cells, r)
        n, fixed = fixed_arm(rot, base, spec)
        a = replay(rot, base, spec, mode, slots, every, horizon)
        ratio = a["cpu_s"] / fixed if n and a["decided"] == len(cells) - 1 else None
        rows.append({"rotation": r, "fixed_seeds": n, "fixed_cpu_s": fixed, **a, "cost_ratio": ratio})
    return rows


def median_max(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """The median and max cost ratio of ``rows`` (a rotation that did not decide counts as inf)."""
    ratios = [x["cost_ratio"] if x["cost_ratio"] is not None else math.inf for x in rows]
    return statistics.median(ratios), max(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="adaptive_seeds.py's --cache")
    ap.add_argument("--every", type=int, default=10, help="steps between looks")
    ap.add_argument("--slots", type=int, nargs="*", default=[8, 20],
                    help="also replay on these slot counts (the pool's own count always runs)")
    ap.add_argument("--json", type=Path, default=REPO / "results" / "benchmarks" / "adaptive_seeds_interim.json")
    args = ap.parse_args()
    from orchestrator.grid import axis_label, load_grid

    grid = load_grid(GRID)
    spec, decl = grid.spec.adaptive, grid.spec.comparisons[0]
    slots = grid.pools.get(grid.spec.pool).capacity
    cells = recorded(grid, args.cache)
    base = next(k for k in cells if dict(k)[decl.axis] == axis_label(decl.baseline))
    out: dict[str, Any] = {"grid_file": str(GRID.relative_to(REPO)), "slots": slots, "every": args.every,
                           "steps": grid.spec.steps, "cost_unit": "trial process CPU-s x share of steps run",
                           "collapse_seen_at": {",".join(f"{a}={v}" for a, v in k): [t[0] for t in v]
                                                for k, v in cells.items()}}
    for mode in ("nominal", "spending"):
        rows = replay_rotations(cells, base, spec, mode, slots, args.every, grid.spec.steps)
        for x in rows:
            print(f"{mode} rotation {x['rotation']}: fixed n {x['fixed_seeds']}, adaptive decided {x['decided']} "
                  f"({x['later']} with a later RMST than the baseline) at step {x['last_step']}, cost ratio "
                  f"{x['cost_ratio'] if x['cost_ratio'] is None else round(x['cost_ratio'], 3)}", flush=True)
        med, top = median_max(rows)
        out[mode] = {"median": med, "max": top, "rotations": rows}
        print(f"{mode}: cost ratio median {med:.0%}, max {top:.0%}")
    out["slots_study"] = {}
    for n_slots in args.slots:
        for mode in ("nominal", "spending"):
            med, top = median_max(replay_rotations(cells, base, spec, mode, n_slots, args.every, grid.spec.steps))
            out["slots_study"][f"{n_slots}/{mode}"] = {"median": med, "max": top}
            print(f"{n_slots} slots, {mode}: cost ratio median {med:.0%}, max {top:.0%}", flush=True)
    for variant, data in (("run_to_horizon", cells), ("stop_at_collapse", stopped_at_collapse(cells))):
        rows = []
        for r in range(spec.max):
            rot = rotated(data, r)
            n, fixed = fixed_arm(rot, base, spec)
            best = oracle(rot, base, spec, grid.spec.steps)
            rows.append({"rotation": r, "fixed_seeds": n, "fixed_cpu_s": fixed, **best,
                         "cost_ratio": best["cpu_s"] / fixed if n else None})
            print(f"oracle ({variant}) rotation {r}: fixed n {n}, cheapest {best.get('seeds_per_cell')} "
                  f"to step {best.get('horizon')}, cost ratio {rows[-1]['cost_ratio']:.3f}", flush=True)
        ratios = [x["cost_ratio"] if x["cost_ratio"] is not None else math.inf for x in rows]
        out.setdefault("oracle", {})[variant] = {"median": statistics.median(ratios), "min": min(ratios),
                                                 "max": max(ratios), "rotations": rows}
        print(f"oracle ({variant}): cost ratio median {statistics.median(ratios):.0%}, "
              f"min {min(ratios):.0%}, max {max(ratios):.0%}", flush=True)
    out["load_average"] = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
