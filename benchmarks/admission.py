"""How long one budgeted admission takes with 2,000 trials queued and 64 running (issue 27).

A grid of 2,064 sim trials with ``budget: {gpu_hours: ...}``; the planner knows every trial
(as its file refresh would leave it: 64 running with a measured step time and cost so far,
the rest never started), then the gate's question ``Planner.admit(trial, pool, running)`` is
asked for queued trials in turn. The planner's refresh of the trial files (at most once a
second) is not part of it: it is set as just done. Prints the median and p99 of one admission.
Goal: <= 1 ms.

    python benchmarks/admission.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.cost import TrialCost
from orchestrator.grid import expand, load_grid
from orchestrator.scheduler import Planner, Seen

RUNNING = 64


def grid_yaml() -> str:
    lrs = ", ".join(f"{1e-4 * (1 + i):.6g}" for i in range(129))
    return ("name: admission\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 300\nseeds: [0, 1, 2, 3]\n"
            f"axes:\n  train.lr: [{lrs}]\n  correction.is_level: [token, sequence]\n"
            "  pool: [sim-h100, sim-a100]\nbudget: {max_trials: 3000, gpu_hours: 1000000}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "g.yaml").write_text(grid_yaml())
        grid = load_grid(Path(tmp) / "g.yaml")
        trials = expand(grid, force=True)
        planner = Planner(grid, Path(tmp) / "grid", trials, grid.pools.pools)
        running = trials[:RUNNING]
        for i, t in enumerate(running):
            planner.seen[t.trial_id] = Seen(t, cost=TrialCost(0.01 * i, "gpu-hours", steps_run=10 + i,
                                                               step_s=0.5 + 0.001 * i, running=True))
        for t in trials[RUNNING:]:
            planner.seen[t.trial_id] = Seen(t)
        planner.REFRESH_S = float("inf")  # the file refresh is not timed (see the docstring)
        pairs = [(t.trial_id, t.pool) for t in running]
        queued = trials[RUNNING:]
        times = []
        for t in queued[:400]:
            t0 = time.perf_counter()
            planner.admit(t, t.pool, pairs)
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    out = {"benchmark": "admission", "queued": len(queued), "running": RUNNING,
           "admissions": len(times), "median_ms": round(statistics.median(times), 4),
           "p99_ms": round(times[int(len(times) * 0.99) - 1], 4),
           "loadavg": Path("/proc/loadavg").read_text().strip()}
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
