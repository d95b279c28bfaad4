"""Logging one 500-step x 40-metric trial to MLflow: batched ``TrialRun.log`` vs one call per value.

Both paths run in this process against fresh runs in one SQLite store (the embedded default), so
the ratio is measured in one run. The batched path is the real one (durable on-disk outbox, then
``log_batch`` of up to 999 values per call); the per-value path is ``MlflowClient.log_metric``.
Goal: batched >= 20x faster and under 2 s.

    .venv/bin/python benchmarks/tracking.py [--steps 500] [--metrics 40] [--per-value-steps N]

``--per-value-steps N`` times the per-value path on the first N steps only and scales it to the
full trial (say so when you quote it); the default times all of it (~1-2 minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def rows(steps: int, n_metrics: int, seed: int = 0) -> list[tuple[int, dict[str, float]]]:
    from orchestrator import metrics as M

    names = [M.TRAIN_REWARD, M.GRAD_NORM, M.K3_KL, M.ENTROPY, M.TRAINING_PPL, M.EVAL_REWARD]
    names += [f"rollout_corr/extra_{i}" for i in range(max(n_metrics - len(names), 0))]
    rng = np.random.default_rng(seed)
    return [(s, dict(zip(names[:n_metrics], map(float, rng.random(n_metrics))))) for s in range(1, steps + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--metrics", type=int, default=40)
    ap.add_argument("--per-value-steps", type=int, default=None)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from orchestrator.grid import expand, load_grid
    from orchestrator.tracking import GridRun, TrialRun, client

    repo = Path(__file__).resolve().parent.parent
    grid = load_grid(repo / "grids" / "quickstart.yaml")
    trial = expand(grid)[0]
    data = rows(args.steps, args.metrics)
    n_values = args.steps * args.metrics
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri = f"sqlite:///{root / 'mlflow.db'}"
        parent = GridRun.open(grid, tracking_uri=uri, workdir=root)  # creates the schema: not timed
        run = TrialRun(uri, parent.experiment_id, parent.run_id, trial, grid.pools.get(trial.pool),
                       run_id=None, buffer_dir=root / "buf")
        t0 = time.perf_counter()
        run.log(data)
        batched = time.perf_counter() - t0
        assert run.outbox.empty(), "the batched path left rows unsent"
        mlc = client(uri)
        got = len(mlc.get_metric_history(run.run_id, "actor/grad_norm"))
        assert got == args.steps, f"{got} grad-norm points, expected {args.steps}"

        per_run = mlc.create_run(parent.experiment_id, run_name="per-value").info.run_id
        per_steps = min(args.per_value_steps or args.steps, args.steps)
        t0 = time.perf_counter()
        for step, values in data[:per_steps]:
            for key, value in values.items():
                mlc.log_metric(per_run, key, value, step=step)
        per_value_measured = time.perf_counter() - t0
        per_value = per_value_measured * args.steps / per_steps
    ratio = per_value / batched
    out = {"steps": args.steps, "metrics": args.metrics, "values": n_values,
           "batched_s": round(batched, 3), "batched_values_per_s": round(n_values / batched),
           "per_value_s": round(per_value, 2), "per_value_steps_timed": per_steps,
           "per_value_extrapolated": per_steps < args.steps, "ratio": round(ratio, 1),
           "goal_ratio_20x": ratio >= 20, "goal_batched_under_2s": batched < 2.0}
    load = os.getloadavg()[0]
    out["load_average_1min"] = round(load, 2)
    out["cpus"] = os.cpu_count()
    # Wall-clock figures: on a shared machine they scale with the load (printed alongside).
    print(f"{n_values} values ({args.steps} steps x {args.metrics} metrics) on SQLite; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"  batched TrialRun.log : {batched:7.2f} s  ({n_values / batched:,.0f} values/s)")
    note = f" (timed {per_steps} steps, scaled)" if per_steps < args.steps else ""
    print(f"  one call per value   : {per_value:7.2f} s{note}")
    print(f"  ratio                : {ratio:7.1f}x  (goal >= 20x: {'met' if ratio >= 20 else 'NOT met'}; "
          f"batched < 2 s: {'met' if batched < 2 else 'NOT met'})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
