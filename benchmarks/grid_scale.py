"""Figures for grid validation + expansion at scale (issue 2).

Writes a 100,000-trial grid (5 lr x 2 IS levels x 2 IS modes x 5 IS bounds x 2 BN x 4 pools
x 5 engine bundles x 25 seeds), then in a fresh subprocess each:
  * ``ablate``'s path: load + schema + recipe compose + semantic checks + expand (ids hashed);
  * a baseline in the same run: bare ``itertools.product`` + JSON + SHA-256 of each point, with
    no validation, normalisation or dedup -- the floor any expander pays.
Prints wall time and peak RSS of both. Goal: ablate < 2 s and < 500 MB.

    python benchmarks/grid_scale.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

GRID = """\
name: scale-100k
recipe: sim/grpo_tiny
backend: sim
steps: 300
seeds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
budget: {max_trials: 100000}
axes:
  train.lr: [1.0e-4, 3.0e-4, 1.0e-3, 3.0e-3, 1.0e-2]
  correction.is_level: [token, sequence]
  correction.is_mode: [truncate, mask]
  correction.is_bounds: [[0.5, 2.0], [0.5, 5.0], [0.9, 1.1], [0.99, 1.01], [0.999, 1.001]]
  correction.batch_norm: [false, true]
  pool: [sim-h100, sim-h20, sim-l20, sim-a100]
  engine:
    default: {}
    fp32-head: {rollout.lm_head_fp32: true}
    fp16: {rollout.dtype: fp16}
    lag1: {rollout.weight_lag: 1}
    det: {rollout.deterministic: true}
"""

ABLATE = """
import json, resource, sys, time
t0 = time.perf_counter()
from orchestrator.grid import load_grid, expand
grid = load_grid(sys.argv[1])
trials = expand(grid)
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "trials": len(trials), "upper_bound": grid.upper_bound,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

BASELINE = """
import hashlib, itertools, json, resource, sys, time
t0 = time.perf_counter()
import yaml
g = yaml.safe_load(open(sys.argv[1]))
axes = [[(k, v) for v in (vals if isinstance(vals, list) else list(vals))] for k, vals in g["axes"].items()]
ids = []
for combo in itertools.product(*axes, [("seed", s) for s in g["seeds"]]):
    ids.append(hashlib.sha256(json.dumps(dict(combo), sort_keys=True).encode()).hexdigest()[:12])
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "trials": len(ids),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(code: str, grid: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", code, str(grid)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        grid = Path(tmp) / "scale.yaml"
        grid.write_text(GRID)
        ours = _run(ABLATE, grid)
        base = _run(BASELINE, grid)
    print(textwrap.dedent(f"""\
        grid_scale: {ours['upper_bound']} grid points -> {ours['trials']} trials after dedup
          ablate load+validate+expand : {ours['seconds']:.2f} s, peak RSS {ours['rss_mb']:.0f} MB
          baseline product+hash only  : {base['seconds']:.2f} s, peak RSS {base['rss_mb']:.0f} MB
          ratio ablate/baseline       : {ours['seconds'] / base['seconds']:.2f}x
          goal: < 2 s and < 500 MB -> {'MET' if ours['seconds'] < 2 and ours['rss_mb'] < 500 else 'NOT MET'}"""))


if __name__ == "__main__":
    main()
