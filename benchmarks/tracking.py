"""Logging one 500-step x 40-metric trial to MLflow: batched ``TrialRun.log`` vs one call per value.

All paths run in this process against fresh runs in one SQLite store (the embedded default), so
the ratios are measured in one run under the same load. The batched path is the real one
(``TrialRun.log``: durable on-disk outbox, then ``log_batch`` of up to 999 values per call); the
reference is plain ``MlflowClient.log_batch`` of 1000 values per call with no outbox (what
MLflow itself costs: our overhead is the difference); the per-value path is
``MlflowClient.log_metric``. Batched and plain alternate ``--repeat`` times; the best of each is
quoted (the least disturbed by other processes), with CPU seconds of this process, which load
disturbs less than wall time. Goal: batched >= 20x faster than per-value and under 2 s.

    .venv/bin/python benchmarks/tracking.py [--steps 500] [--metrics 40] [--repeat 3] [--per-value-steps N]

``--per-value-steps N`` times the per-value path on the first N steps only and scales it to the
full trial (say so when you quote it); the default times all of it (~1-6 minutes).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def rows(steps: int, n_metrics: int, seed: int = 0) -> list[tuple[int, dict[str, float]]]:
    from orchestrator import metrics as M

    names = [M.TRAIN_REWARD, M.GRAD_NORM, M.K3_KL, M.ENTROPY, M.TRAINING_PPL, M.EVAL_REWARD]
    names += [f"rollout_corr/extra_{i}" for i in range(max(n_metrics - len(names), 0))]
    rng = np.random.default_rng(seed)
    return [(s, dict(zip(names[:n_metrics], map(float, rng.random(n_metrics))))) for s in range(1, steps + 1)]


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def plain_log_batch(mlc: Any, experiment_id: str, data: list[tuple[int, dict[str, float]]]) -> None:
    """MLflow alone: the same values in ``log_batch`` calls of 1000 (its limit), no outbox."""
    from mlflow.entities import Metric

    run_id = mlc.create_run(experiment_id, run_name="plain-log-batch").info.run_id
    ts = int(time.time() * 1000)
    flat = [Metric(k, v, ts, s) for s, values in data for k, v in values.items()]
    for i in range(0, len(flat), 1000):
        mlc.log_batch(run_id, metrics=flat[i:i + 1000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--metrics", type=int, default=40)
    ap.add_argument("--per-value-steps", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3, help="alternate batched and plain this many times")
    ap.add_argument("--journal", choices=("wal", "delete"), default="wal",
                    help="SQLite journal mode of the store (wal: what ablate sets; delete: SQLite's default)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from orchestrator import tracking
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
        if args.journal == "delete":  # SQLite's default, for comparison (GridRun.open sets WAL)
            tracking.use_wal = lambda _uri: None
        parent = GridRun.open(grid, tracking_uri=uri, workdir=root)  # creates the schema: not timed
        mlc = client(uri)
        with contextlib.closing(sqlite3.connect(root / "mlflow.db")) as db:
            journal = db.execute("PRAGMA journal_mode").fetchone()[0]
        batched_runs, plain_runs = [], []
        for i in range(args.repeat):
            run = TrialRun(uri, parent.experiment_id, parent.run_id, trial, grid.pools.get(trial.pool),
                           run_id=None, buffer_dir=root / f"buf{i}")
            batched_runs.append(timed(functools.partial(run.log, data)))
            assert run.outbox.empty(), "the batched path left rows unsent"
            got = len(mlc.get_metric_history(run.run_id, "actor/grad_norm"))
            assert got == args.steps, f"{got} grad-norm points, expected {args.steps}"
            plain_runs.append(timed(lambda: plain_log_batch(mlc, parent.experiment_id, data)))
        batched, batched_cpu = min(batched_runs)
        plain, plain_cpu = min(plain_runs)

        per_run = mlc.create_run(parent.experiment_id, run_name="per-value").info.run_id
        per_steps = min(args.per_value_steps or args.steps, args.steps)
        t0 = time.perf_counter()
        for step, values in data[:per_steps]:
            for key, value in values.items():
                mlc.log_metric(per_run, key, value, step=step)
        per_value_measured = time.perf_counter() - t0
        per_value = per_value_measured * args.steps / per_steps
    ratio = per_value / batched
    load = os.getloadavg()[0]
    out = {"steps": args.steps, "metrics": args.metrics, "values": n_values, "journal_mode": journal,
           "repeat": args.repeat, "batched_s": round(batched, 3), "batched_cpu_s": round(batched_cpu, 3),
           "batched_all_s": [round(w, 2) for w, _ in batched_runs],
           "batched_values_per_s": round(n_values / batched),
           "plain_log_batch_s": round(plain, 3), "plain_log_batch_cpu_s": round(plain_cpu, 3),
           "plain_all_s": [round(w, 2) for w, _ in plain_runs],
           "overhead_vs_plain": round(batched / plain, 2),
           "per_value_s": round(per_value, 2), "per_value_steps_timed": per_steps,
           "per_value_extrapolated": per_steps < args.steps, "ratio": round(ratio, 1),
           "goal_ratio_20x": ratio >= 20, "goal_batched_under_2s": batched < 2.0,
           "load_average_1min": round(load, 2), "cpus": os.cpu_count()}
    # Wall-clock figures: on a shared machine they scale with the load (printed alongside).
    print(f"{n_values} values ({args.steps} steps x {args.metrics} metrics) on SQLite "
          f"(journal {journal}); load average {load:.1f} on {os.cpu_count()} CPUs; best of {args.repeat}")
    print(f"  batched TrialRun.log : {batched:7.2f} s wall, {batched_cpu:5.2f} s CPU  "
          f"({n_values / batched:,.0f} values/s; all: {out['batched_all_s']})")
    print(f"  plain log_batch      : {plain:7.2f} s wall, {plain_cpu:5.2f} s CPU  (no outbox; all: "
          f"{out['plain_all_s']}) -> ours is {batched / plain:.2f}x of it")
    note = f" (timed {per_steps} steps, scaled)" if per_steps < args.steps else ""
    print(f"  one call per value   : {per_value:7.2f} s{note}")
    print(f"  ratio                : {ratio:7.1f}x  (goal >= 20x: {'met' if ratio >= 20 else 'NOT met'}; "
          f"batched < 2 s: {'met' if batched < 2 else 'NOT met'})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
