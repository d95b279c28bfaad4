"""Orchestration overhead vs plain Ray Tune, and pool utilisation while trials are queued.

1. Overhead: the same trivial trainable (``--steps`` steps of ``--step-s`` seconds of sleep,
   four metrics a step, no checkpoint) over ``--trials`` trials, run (a) by plain Ray Tune (function
   trainable, ``reuse_actors=True``, ``tune.report`` per step, same concurrency) and (b) by
   ``ablate submit`` (gate, runner, state files, metrics.jsonl, checkpoint store with manifests,
   verdict engine, an MLflow child run per trial on the SQLite store with its params, tags,
   metrics, artifacts and end status, and the parent run; ``submit`` returns once all of it is
   in MLflow). Both on the same local Ray instance in the same process, ``--repeat`` of each in
   ABBA order; the figure is the median ratio of wall times (goal <= 1.15 at 100 trials, <= 1.05
   at 1,000). Ray's own start-up is outside both. Plain Tune keeps its default per-trial logger
   files (JSON, CSV, TensorBoard), which ``ablate submit`` turns off (it writes its own);
   ``--bare-tune`` turns them off for plain Tune too (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``):
   Tune doing nothing but run and report.
2. Utilisation: a local multi-raylet cluster (``ray.cluster_utils.Cluster``), one node per pool
   with capacity 2, more trials queued than slots; every 50 ms the driver samples how much of each
   pool's Ray resource is held (``ray.available_resources()``); busy = mean held / capacity over
   the window from the pool's first placement to its last trial's start (while trials are
   queued). Goal >= 90%. Held counts a slot whose worker is still starting as busy; the second
   figure, "running", counts only time inside attempts (from the attempt records), between the
   pool's first and last attempt start: the gap between one trial's end and the next's start.

Run: ``.venv/bin/python benchmarks/orchestration_overhead.py --out results/benchmarks/orchestration_overhead.json``
(prints the figures; ~5 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from orchestrator.backends.base import AttemptOutcome, AttemptResult, Trainer


class TrivialTrainer(Trainer):
    """Sleeps ``BENCH_STEP_S`` per step, logs 4 metrics, checkpoints a tiny JSON file if asked."""

    name = "sim"
    version = "bench-1"
    pool_kinds = ("sim",)

    def run(self, trial: Any, config: Mapping[str, Any], ctx: Any) -> AttemptResult:
        step_s = float(os.environ["BENCH_STEP_S"])
        start = ctx.resume_step or 0
        for step in range(start + 1, trial.steps + 1):
            if ctx.should_stop():
                return AttemptResult(AttemptOutcome.STOPPED, step - 1, ctx.should_stop())
            time.sleep(step_s)
            ctx.log_metrics(step, {"critic/score/mean": step / trial.steps, "eval/reward": 0.5,
                                   "actor/grad_norm": 1.0, "rollout_corr/k3_kl": 1e-4})
            if step % ctx.checkpoint_every == 0:
                ctx.save_checkpoint(step, lambda d, s=step: (d / "s.json").write_text(json.dumps(s)))
        return AttemptResult(AttemptOutcome.COMPLETED, trial.steps)


def plain_trainable(config: dict[str, Any]) -> None:
    """The same work as TrivialTrainer, as a plain Ray Tune function trainable."""
    from ray import tune

    step_s = float(os.environ["BENCH_STEP_S"])
    for step in range(1, config["steps"] + 1):
        time.sleep(step_s)
        tune.report({"critic/score/mean": step / config["steps"], "eval/reward": 0.5,
                     "actor/grad_norm": 1.0, "rollout_corr/k3_kl": 1e-4})


def _grid_file(path: Path, name: str, *, trials: int, steps: int, pools: list[str],
               max_parallel: int, checkpoint_every: int = 1_000_000) -> Path:
    seeds = list(range(trials // len(pools)))
    path.write_text(f"name: {name}\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: {steps}\n"
                    f"seeds: {seeds}\naxes:\n  pool: {pools}\ncollapse: {{rules: none}}\n"
                    f"checkpoint: {{every: {checkpoint_every}, keep: 2}}\n"
                    f"budget: {{max_parallel: {max_parallel}, max_trials: 100000}}\n")
    return path


def _register() -> None:
    from orchestrator import backends

    backends._TRAINERS["sim"] = ("orchestration_overhead", "TrivialTrainer")


def _plain(args: argparse.Namespace, work: Path, run: int) -> float:
    from ray import tune

    from orchestrator.store.workspace import scoped_environ

    t0 = time.perf_counter()
    with scoped_environ({"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"} if args.bare_tune else {}):
        results = tune.Tuner(
            tune.with_resources(plain_trainable, {"CPU": 1, "pool:sim-h100": 1}),
            param_space={"steps": args.steps, "i": tune.grid_search(list(range(args.trials)))},
            tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=args.parallel),
            run_config=tune.RunConfig(name=f"plain{run}", storage_path=str(work / "plain"), verbose=0),
        ).fit()
    elapsed = time.perf_counter() - t0
    assert len(results) == args.trials and not results.errors
    return elapsed


def _ablate(args: argparse.Namespace, work: Path, run: int) -> float:
    from orchestrator import scheduler

    grid = _grid_file(work / f"bench{run}.yaml", f"bench{run}", trials=args.trials, steps=args.steps,
                      pools=["sim-h100"], max_parallel=args.parallel)
    t0 = time.perf_counter()
    # Until every trial's metrics, tags, artifacts and end are in MLflow (submit drains them).
    summary = scheduler.submit(str(grid), workdir=str(work / "wd"), progress=False)
    elapsed = time.perf_counter() - t0
    assert summary["states"] == {"done": args.trials}, summary["states"]
    return elapsed


def overhead(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Plain Tune and ``ablate submit`` on one Ray instance, in ABBA order (``--repeat`` pairs):
    neither side always runs first (cold page cache, the other helpers' load drifting)."""
    import ray

    slots = args.parallel
    ray.init(num_cpus=slots, resources={"pool:sim-h100": slots}, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    plain: list[float] = []
    ours: list[float] = []
    loads: list[float] = []
    try:
        for run in range(args.repeat):
            order = (_plain, _ablate) if run % 2 == 0 else (_ablate, _plain)
            for fn in order:
                loads.append(os.getloadavg()[0])
                (plain if fn is _plain else ours).append(fn(args, work, run))
    finally:
        ray.shutdown()
    ideal = args.trials * args.steps * args.step_s / slots
    ratios = sorted(o / p for o, p in zip(ours, plain))
    return {"plain_tune_s": plain, "ablate_s": ours, "ratios": ratios, "ratio": statistics.median(ratios),
            "ideal_s": ideal,
            "overhead_per_trial_s": (statistics.median(ours) - statistics.median(plain)) * slots / args.trials,
            "load_1min": loads}


def utilisation(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Sample how much of each pool's Ray resource is held while its trials are queued."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from orchestrator import scheduler
    from orchestrator.store import TrialPaths, records

    pools = ["sim-h100", "sim-a100"]
    cap = 2
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for p in pools:
        c.add_node(num_cpus=cap, resources={f"pool:{p}": cap})
    c.wait_for_nodes()
    samples: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            free = ray.available_resources()
            samples.append((time.time(), {p: cap - free.get(f"pool:{p}", 0.0) for p in pools}))
            time.sleep(0.05)

    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    th = threading.Thread(target=sample, daemon=True)
    try:
        grid = _grid_file(work / "util.yaml", "util", trials=args.util_trials, steps=args.util_steps,
                          pools=pools, max_parallel=cap * len(pools))
        th.start()
        summary = scheduler.submit(str(grid), address=c.address, workdir=str(work / "wd"),
                                   progress=False)
    finally:
        stop.set()
        th.join()
        ray.shutdown()
        c.shutdown()
    grid_dir = Path(summary["grid_dir"])
    starts: dict[str, list[float]] = {p: [] for p in pools}
    spans: dict[str, list[tuple[float, float]]] = {p: [] for p in pools}
    for spec in (grid_dir / "trials").glob("*/spec.json"):
        for a in records.load_attempts(TrialPaths(grid_dir, spec.parent.name)):
            starts[a.pool].append(a.started_at)
            spans[a.pool].append((a.started_at, a.ended_at or a.started_at))
    out: dict[str, Any] = {}
    for pool in pools:
        # Window: from the first moment the pool holds a trial to the start of its last trial
        # (after that nothing is queued for it, and the tail drains by design).
        first = next(t for t, used in samples if used[pool] > 0)
        last = max(starts[pool])
        window = [used[pool] for t, used in samples if first <= t <= last]
        # Stricter: slot time inside attempts (the runner's own start to end) between the
        # pool's first and last attempt start; a slot held by a starting worker counts idle.
        lo, hi = min(starts[pool]), max(starts[pool])
        inside = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans[pool])
        out[pool] = {"busy_fraction": sum(window) / (cap * len(window)), "window_s": last - first,
                     "running_fraction": inside / (cap * (hi - lo)), "running_window_s": hi - lo,
                     "trials": len(starts[pool])}
    per_pool = [out[p] for p in pools]
    out["overall"] = (sum(v["busy_fraction"] * v["window_s"] for v in per_pool)
                      / sum(v["window_s"] for v in per_pool))
    out["overall_running"] = (sum(v["running_fraction"] * v["running_window_s"] for v in per_pool)
                              / sum(v["running_window_s"] for v in per_pool))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="plain/ablate pairs, in ABBA order")
    ap.add_argument("--util-trials", type=int, default=24)
    ap.add_argument("--util-steps", type=int, default=40)
    ap.add_argument("--skip-util", action="store_true")
    ap.add_argument("--bare-tune", action="store_true",
                    help="plain Tune without its default per-trial logger files (as ablate runs it)")
    ap.add_argument("--out", help="write the figures as JSON here (with the machine's load)")
    args = ap.parse_args()
    os.environ["BENCH_STEP_S"] = str(args.step_s)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("ABLATE_RECIPES", str(REPO / "recipes"))
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb", dir="/tmp"))
    _register()
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    figures: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count(),
                               "uptime_before": _uptime(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        o = overhead(args, work)
        figures["overhead"] = o
        print(f"overhead: {args.trials} trials x {args.steps} steps x {args.step_s:g} s, "
              + ("plain Tune without its logger files, " if args.bare_tune else "")
              + f"{args.parallel} slots (ideal {o['ideal_s']:.1f} s), {args.repeat} runs each, ABBA order")
        print(f"  plain Ray Tune   {' '.join(f'{v:6.1f}' for v in o['plain_tune_s'])} s")
        print(f"  ablate submit    {' '.join(f'{v:6.1f}' for v in o['ablate_s'])} s")
        print(f"  ratio            {o['ratio']:7.3f}   (median of {', '.join(f'{r:.3f}' for r in o['ratios'])}; "
              f"goal <= 1.15 at 100 trials, <= 1.05 at 1,000)")
        print(f"  overhead/trial   {o['overhead_per_trial_s']:7.3f} s of slot time")
        print(f"  load (1 min)     {' '.join(f'{v:.1f}' for v in o['load_1min'])}")
        if not args.skip_util:
            u = utilisation(args, work)
            figures["utilisation"] = u
            print(f"utilisation: {args.util_trials} trials x {args.util_steps} steps x "
                  f"{args.step_s:g} s on 2 pools x capacity 2 (multi-raylet local cluster)")
            for pool in ("sim-h100", "sim-a100"):
                v = u[pool]
                print(f"  {pool}: {100 * v['busy_fraction']:5.1f}% held over {v['window_s']:.1f} s, "
                      f"{100 * v['running_fraction']:5.1f}% running trials over {v['running_window_s']:.1f} s "
                      f"({v['trials']} trials)")
            print(f"  overall  {100 * u['overall']:5.1f}% held, {100 * u['overall_running']:5.1f}% running"
                  f"   (goal >= 90%)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["uptime_after"] = _uptime()
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    main()
