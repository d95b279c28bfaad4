"""What pinned, explicit simulator numerics cost per step (a benchmark, not a test).

In one run, interleaved, each configuration in its own process (the numeric variables are read
once, when torch first dispatches), N steps of the quickstart trial on sim-h100 (token TIS):

- ``explicit, pinned``: what every trial runs (fp32 GEMMs over rounded operands; ATen/MKL/oneDNN
  pinned to AVX2, ``orchestrator/sim/numerics.py``);
- ``explicit, unpinned``: the same arithmetic at the CPU's own instruction-set level;
- ``native, unpinned``: the engine's GEMMs on the CPU's own bf16/fp16 kernels (``sim-1``);
- ``native, AVX2 kernels``: the same with the libraries capped at AVX2, i.e. the kernels an AVX2
  machine without native bf16 runs (the slow fallback ``sim-1`` met there).

Prints the median step time of each and the ratios: pinning's cost (explicit pinned / unpinned)
and the speed-up of the explicit arithmetic over native kernels. Also checks that the two
pinned explicit processes agree bit for bit (their last-step metrics).

Usage: .venv/bin/python benchmarks/sim_numerics.py [--steps 60] [--rounds 3] [--out F.json]
Run it on a quiet machine: every configuration shares the cores with nothing else.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CONFIGS = {
    "explicit, pinned": ("explicit", True, {}),
    "explicit, unpinned": ("explicit", False, {}),
    "native, unpinned": ("native", False, {}),
    "native, AVX2 kernels": ("native", True, {}),
}
QUICKSTART = {"correction.is_level": "token", "correction.is_mode": "truncate",
              "correction.is_bounds": [0.5, 2.0]}
WARM_UP = 5


def child(kernels: str, steps: int) -> None:
    """Run ``steps`` steps in this process and print one JSON line of figures."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from sim_step import trainer_for

    from orchestrator import metrics as M
    from orchestrator.sim.rollout import RolloutEngine

    torch.set_num_threads(1)
    tr = trainer_for(QUICKSTART, "sim-h100")
    if kernels == "native":
        tr.engine = RolloutEngine(tr.model, tr.task, tr.num, kernels="native")
        tr.engine.sync(tr.params)
    times, last = [], {}
    for step in range(1, steps + WARM_UP + 1):
        last = tr.step(step)
        if step > WARM_UP and M.EVAL_REWARD not in last:  # eval steps also roll out 128 prompts
            times.append(last[M.TIME_PER_STEP])
    print(json.dumps({"median_step_s": statistics.median(times), "steps": len(times),
                      "capability": torch.backends.cpu.get_cpu_capability(),
                      "last": {k: v for k, v in last.items() if not k.startswith(("perf/", "timing_s/"))}}))


def run_config(name: str, steps: int) -> dict:
    from orchestrator.sim import numerics

    kernels, pinned, _ = CONFIGS[name]
    env = dict(os.environ)
    for key, value in numerics.target_env(pinned).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run([sys.executable, __file__, "--child", kernels, "--steps", str(steps)],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=["explicit", "native"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    load_before = list(os.getloadavg())
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):  # interleaved: every configuration sees the same machine
        for name in CONFIGS:
            runs[name].append(run_config(name, args.steps))
    med = {name: statistics.median(r["median_step_s"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        print(f"{name:22s} median step {med[name] * 1e3:6.1f} ms  (ATen {rs[0]['capability']}; "
              "per round: " + ", ".join(f"{r['median_step_s'] * 1e3:.1f}" for r in rs) + ")")
    pinned = runs["explicit, pinned"]
    same = all(r["last"] == pinned[0]["last"] for r in pinned)
    figures = {
        "steps": args.steps, "rounds": args.rounds, "median_step_s": med,
        "pinning_cost": med["explicit, pinned"] / med["explicit, unpinned"],
        "speedup_vs_native": med["native, unpinned"] / med["explicit, pinned"],
        "speedup_vs_avx2_native": med["native, AVX2 kernels"] / med["explicit, pinned"],
        "pinned_runs_bitwise_equal": same,
        "load_before": load_before, "load_after": list(os.getloadavg()),
    }
    print(f"pinning costs {figures['pinning_cost']:.2f}x the unpinned step; explicit arithmetic is "
          f"{figures['speedup_vs_native']:.2f}x faster than this CPU's native kernels and "
          f"{figures['speedup_vs_avx2_native']:.2f}x faster than the AVX2-level native kernels; "
          f"pinned runs bit-for-bit equal: {same}")
    print(f"load average before/after: {load_before} / {figures['load_after']}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
