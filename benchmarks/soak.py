"""Soak: a 200-trial tiny grid on the local Ray cluster; does the orchestrator stay flat?

``ablate submit`` runs in this process (``scheduler.submit``, the embedded local Ray it starts,
the real CPU simulator, MLflow on the workdir's SQLite store) over ``--trials`` trials of
``--steps`` steps each (one seed per trial, the tiny simulator config). A sampler thread reads,
every ``--every`` seconds, with psutil:

* the orchestrator process: RSS, open file descriptors, threads;
* the processes under it (Ray's GCS, raylet, workers, ...): count and summed RSS;
* the machine's total process count (noisy: other work on the machine counts too);
* trials finished so far (``result.json`` files).

Printed figures: each series at start (first sample with >= 10% of the trials done, after the
warm-up of Ray's workers and MLflow's schema), mid (50%) and end (last sample before the last
trial finished; Ray's teardown comes after), and its least-squares slope per 100 finished
trials from start to end; and what is left under the process once submit returned. "Flat" means:
fds and process count grow by less than 5 per 100 trials, RSS by less than 50 MB per 100 trials.

Run: ``.venv/bin/python benchmarks/soak.py --out results/benchmarks/soak.json`` (~10-20 minutes
on 2 shared cores). ``tests/reliability/test_soak.py`` (marker ``soak``) runs it and asserts.

``--queued 100 2000`` measures instead how ``ablate submit``'s own cost depends on the number of
queued trials (issue 27): for each count, in a fresh process, it submits that many trials,
waits until the first has finished (Ray and MLflow warm), then for ``--window`` seconds reads
the submitting process's CPU time (its threads only: Ray's workers, where the trials run, are
other processes) and RSS, and then cancels the grid. Printed per count: CPU seconds per wall
second, CPU seconds per trial finished in the window, RSS at the window's start and its peak.
Trials finishing cost submit CPU each (events, results, MLflow), so CPU per second follows how
many finished; ``--hold-steps N`` measures each count again with trials of N steps that outlast
the window (warm once the first step is logged, plus 15 s): the CPU per second of a submit with
nothing finishing, which is what a growing queue would make grow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LIMITS = {"fds": 5.0, "children": 5.0, "rss_mb": 50.0, "children_rss_mb": 150.0}  # per 100 trials
SERIES = ("rss_mb", "fds", "threads", "children", "children_rss_mb", "system_procs")

GRID = """\
name: soak
recipe: sim/grpo_tiny
backend: sim
steps: {steps}
seeds: {seeds}
axes:
  correction.is_level: [token]
  pool: [sim-h100]
collapse: {{rules: none}}
checkpoint: {{every: {every}, keep: 1}}
budget: {{max_parallel: {parallel}, max_trials: 100000}}
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  train.minibatches: 1
  eval.every: {steps}
  eval.prompts: 16
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
"""


class Sampler(threading.Thread):
    """Samples this process, its descendants and the machine every ``every`` seconds."""

    def __init__(self, trials_dir: Path, every: float) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process()
        self.trials_dir = trials_dir
        self.every = every
        self.samples: list[dict[str, float]] = []
        self.t0 = time.time()
        self._halt = threading.Event()

    def sample(self) -> dict[str, float]:
        import psutil

        kids = []
        for c in self.proc.children(recursive=True):
            try:
                kids.append(c.memory_info().rss)
            except psutil.Error:
                pass
        done = (
            sum(1 for _ in self.trials_dir.glob("*/result.json"))
            if self.trials_dir.is_dir()
            else 0
        )
        return {
            "t": round(time.time() - self.t0, 2),
            "done": done,
            "rss_mb": round(self.proc.memory_info().rss / 2**20, 1),
            "fds": self.proc.num_fds(),
            "threads": self.proc.num_threads(),
            "children": len(kids),
            "children_rss_mb": round(sum(kids) / 2**20, 1),
            "system_procs": len(psutil.pids()),
        }

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(self.sample())
            self._halt.wait(self.every)

    def stop(self) -> list[dict[str, float]]:
        self._halt.set()
        self.join(10)
        return self.samples


def slope_per_100(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs, times 100 (per 100 finished trials)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


def summarize(samples: list[dict[str, float]], trials: int) -> dict[str, Any]:
    """Start/mid/end values and slopes per 100 trials over the window after the warm-up."""
    # From the warm-up's end to the last sample before the last trial finished (after it,
    # submit tears Ray down, which is not the steady state).
    window = [s for s in samples if max(1, trials // 10) <= s["done"] < trials]
    if len(window) < 3:
        window = samples
    mid = min(window, key=lambda s: abs(s["done"] - trials / 2))
    out: dict[str, Any] = {}
    for key in SERIES:
        out[key] = {
            "start": window[0][key],
            "mid": mid[key],
            "end": window[-1][key],
            "max": max(s[key] for s in window),
            "slope_per_100_trials": round(
                slope_per_100([s["done"] for s in window], [s[key] for s in window]), 2
            ),
        }
    out["window"] = {
        "from_done": window[0]["done"],
        "to_done": window[-1]["done"],
        "samples": len(window),
    }
    out["flat"] = {k: abs(out[k]["slope_per_100_trials"]) < lim for k, lim in LIMITS.items()}
    return out


def _soak_grid(workdir: Path, trials: int, steps: int, parallel: int, checkpoint_every: int) -> Path:
    """This process's environment pointed at ``workdir`` and the soak grid written there."""
    os.environ["ABLATE_WORKDIR"] = str(workdir)
    os.environ.setdefault("ABLATE_RECIPES", str(REPO / "recipes"))
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    grid = workdir / "soak.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    grid.write_text(GRID.format(steps=steps, seeds=list(range(trials)), every=checkpoint_every,
                                parallel=parallel))
    return grid


def run(trials: int, steps: int, parallel: int, every: float, workdir: Path) -> dict[str, Any]:
    from orchestrator import scheduler

    grid = _soak_grid(workdir, trials, steps, parallel, checkpoint_every=max(1, steps // 2))
    sampler = Sampler(workdir / "soak" / "trials", every)
    sampler.start()
    t0 = time.time()
    try:
        summary = scheduler.submit(str(grid), progress=False, ray_tmp=str(workdir / "ray"))
    finally:
        samples = sampler.stop()
    elapsed = time.time() - t0
    after = sampler.sample()  # Ray shut down: what is left under this process
    return {
        "trials": trials,
        "steps": steps,
        "max_parallel": parallel,
        "elapsed_s": round(elapsed, 1),
        "trials_per_min": round(60 * trials / elapsed, 1),
        "states": summary["states"],
        "after_shutdown": after,
        "figures": summarize(samples, trials),
        "samples": samples,
    }


def _first_step_seen(trials_dir: Path) -> bool:
    return any(f.stat().st_size > 0 for f in trials_dir.glob("*/metrics.jsonl"))


def run_queued(trials: int, steps: int, parallel: int, window: float, workdir: Path,
               hold: bool = False) -> dict[str, Any]:
    """``submit`` of ``trials`` trials in this process, its CPU and RSS over ``window`` seconds
    once the first trial has finished (``hold``: once the first trial has logged a step, plus 15 s;
    its trials are meant to outlast the window), then the grid cancelled (see the module docstring)."""
    import psutil

    from orchestrator import scheduler

    grid = _soak_grid(workdir, trials, steps, parallel, checkpoint_every=steps)
    trials_dir = workdir / "soak" / "trials"
    proc, out, t0 = psutil.Process(), {}, time.time()
    warm = (lambda: _first_step_seen(trials_dir)) if hold else (lambda: any(trials_dir.glob("*/result.json")))

    def measure() -> None:
        while not warm():
            if time.time() - t0 > 900:
                out["error"] = "not warm in 900 s"
                break
            time.sleep(0.5)
        else:
            if hold:
                time.sleep(15.0)
            out["warm_s"] = round(time.time() - t0, 1)
            done0 = sum(1 for _ in trials_dir.glob("*/result.json"))
            cpu0, w0 = proc.cpu_times(), time.time()
            rss = [proc.memory_info().rss]
            while time.time() - w0 < window:
                time.sleep(1.0)
                rss.append(proc.memory_info().rss)
            cpu1, w1 = proc.cpu_times(), time.time()
            cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
            finished = sum(1 for _ in trials_dir.glob("*/result.json")) - done0
            out.update(cpu_s_per_s=round(cpu / (w1 - w0), 3),
                       cpu_s_per_finished=round(cpu / finished, 3) if finished else None,
                       rss_mb_start=round(rss[0] / 2**20, 1), rss_mb_peak=round(max(rss) / 2**20, 1),
                       finished_in_window=finished, window_s=round(w1 - w0, 1))
        scheduler.cancel(str(grid), workdir=str(workdir))

    th = threading.Thread(target=measure, daemon=True)
    th.start()
    scheduler.submit(str(grid), progress=False, ray_tmp=str(workdir / "ray"))
    th.join(60)
    return {"queued": trials, "steps": steps, "max_parallel": parallel,
            "window_kind": "running, none finishing" if hold else "trials finishing", **out}


def queued_main(counts: list[int], steps: int, parallel: int, window: float,
                hold_steps: int | None = None) -> dict[str, Any]:
    """``run_queued`` for each count, each in a fresh process (RSS and imports comparable); with
    ``hold_steps``, each count is measured a second time with trials of that many steps, which
    outlast the window: submit's CPU per second with nothing finishing, the part that a growing
    queue could make grow (with trials finishing, their events add CPU per finished trial)."""
    import subprocess

    rows = []
    for n in counts:
        for st, hold in ((steps, False), *(((hold_steps, True),) if hold_steps else ())):
            tmp = tempfile.mkdtemp(prefix="soakq", dir="/tmp")
            try:
                res = subprocess.run([sys.executable, __file__, "--queued-one", str(n), "--steps", str(st),
                                      "--max-parallel", str(parallel), "--window", str(window), "--workdir", tmp,
                                      *(["--hold"] if hold else [])],
                                     capture_output=True, text=True, check=True)
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"benchmark": "submit_queued", "rows": rows}


def print_figures(res: dict[str, Any]) -> None:
    f = res["figures"]
    print(
        f"soak: {res['trials']} trials x {res['steps']} steps in {res['elapsed_s']} s "
        f"({res['trials_per_min']} trials/min), states {res['states']}"
    )
    print(
        f"window: trials {f['window']['from_done']}..{f['window']['to_done']} "
        f"({f['window']['samples']} samples)"
    )
    cols = ("start", "mid", "end", "max")
    print(f"{'series':16s} " + " ".join(f"{c:>9s}" for c in cols) + f" {'slope/100 trials':>17s}")
    for key in SERIES:
        s = f[key]
        print(
            f"{key:16s} {s['start']:9.1f} {s['mid']:9.1f} {s['end']:9.1f} {s['max']:9.1f} "
            f"{s['slope_per_100_trials']:17.2f}"
        )
    a = res["after_shutdown"]
    print(
        f"after Ray shutdown: {a['children']} child processes, {a['fds']} fds, "
        f"rss {a['rss_mb']} MB; flat: {f['flat']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-parallel", type=int, default=2)
    p.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--workdir", help="state directory (default: a temp dir, removed after)")
    p.add_argument("--out", help="write the figures and samples as JSON here")
    p.add_argument("--queued", type=int, nargs="+", help="queued-trial counts: submit's CPU and RSS")
    p.add_argument("--window", type=float, default=60.0, help="--queued: seconds measured")
    p.add_argument("--hold-steps", type=int,
                   help="--queued: also measure each count with trials of this many steps (none finish in the window)")
    p.add_argument("--queued-one", type=int, help=argparse.SUPPRESS)  # internal: one count
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)  # internal: with --queued-one
    args = p.parse_args(argv)
    if args.queued_one:
        print(json.dumps(run_queued(args.queued_one, args.steps, args.max_parallel, args.window,
                                    Path(args.workdir), hold=args.hold)))
        return 0
    if args.queued:
        before = Path("/proc/loadavg").read_text().strip()
        res = {**queued_main(args.queued, args.steps, args.max_parallel, args.window, args.hold_steps),
               "loadavg_before": before, "loadavg_after": Path("/proc/loadavg").read_text().strip()}
        print(json.dumps(res, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        return 0
    tmp = None
    if args.workdir:
        workdir = Path(args.workdir)
    else:
        tmp = tempfile.mkdtemp(prefix="soak", dir="/tmp")  # short: Ray's socket path cap
        workdir = Path(tmp)
    try:
        res = run(args.trials, args.steps, args.max_parallel, args.every, workdir)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print_figures(res)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}")
    return (
        0 if all(res["figures"]["flat"].values()) and res["states"] == {"done": args.trials} else 1
    )


if __name__ == "__main__":
    sys.exit(main())
