"""Golden runs: short fixed simulator trials whose every per-step metric is committed, compared
bit for bit. This is what catches the next drift of the simulator's numbers, whether it comes
from a code change or from the machine (a CPU whose kernels the pins do not cover, a new torch
or MKL): the failure names the run, step and metric, and both numeric environments.

Regenerate after an intended change of the arithmetic (and say why in the commit):
``python tests/sim/test_golden.py --write``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sim import numerics

GOLDEN = Path(__file__).with_name("golden") / "runs.json"
STEPS = 16
# Every engine path the pools use: fp16 with fp32 head/router (h20), bf16 split-K with fp8 KV
# (h100), fp8 W8A8 (l20), int4 W4A16 + fp8 head + weight lag (a100), and MoE routing (h100).
RUNS = {
    "sim-h20/dense": ("sim-h20", {}),
    "sim-h100/dense": ("sim-h100", {"correction.is_level": "token"}),
    "sim-l20/dense": ("sim-l20", {"correction.is_level": "sequence", "correction.is_mode": "mask"}),
    "sim-a100/dense": ("sim-a100", {"correction.rs": "token"}),
    "sim-h100/moe": ("sim-h100", {"model.arch": "moe"}),
}
TIMING = ("perf/", "timing_s/")


def run_golden(name: str, sim: Any) -> tuple[dict[int, dict[str, float]], dict[str, str]]:
    """Per-step metrics (timings dropped) and the numeric environment of one golden run
    (``sim``: the simulator test harness, small batches)."""
    pool_name, overrides = RUNS[name]
    with tempfile.TemporaryDirectory() as tmp:
        result, ctx = sim.run(Path(tmp), sim.pool(pool_name), STEPS, overrides, seed=7)
    assert result.last_step == STEPS, (name, result)
    metrics = {s: {k: v for k, v in m.items() if not k.startswith(TIMING)}
               for s, m in ctx.metrics.items()}
    return metrics, dict(ctx.environment)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_reproduced_bit_for_bit(name: str, sim) -> None:
    golden = json.loads(GOLDEN.read_text())
    metrics, env = run_golden(name, sim)
    assert env.get("numerics.reproducible") == "true", (
        f"this process is not pinned ({env.get('numerics.why')}): golden runs are defined under "
        "pinned numerics")
    made = golden["environment"]
    here = numerics.summary({k.removeprefix("numerics."): v for k, v in env.items()})
    where = (f"golden values made under: {made.get('numerics.summary')}; this run: {here}. If the arithmetic changed on purpose, regenerate "
             "with `python tests/sim/test_golden.py --write`")
    expected = {int(s): m for s, m in golden["runs"][name].items()}
    assert sorted(metrics) == sorted(expected), f"{name}: steps differ; {where}"
    for step in sorted(expected):
        keys = sorted(set(expected[step]) | set(metrics[step]))
        for key in keys:
            want, got = expected[step].get(key), metrics[step].get(key)
            if want is None or got is None or not _same(want, got):
                pytest.fail(f"golden run {name} differs at step {step}, metric {key}: golden "
                            f"{want!r}, now {got!r}; {where}")


def write() -> None:
    """Run every golden run and write ``golden/runs.json`` (pinned numerics only)."""
    numerics.ensure_pinned()
    import torch

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("sim_harness", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    runs: dict[str, Any] = {}
    env: dict[str, str] = {}
    for name in RUNS:
        metrics, env = run_golden(name, harness.SimHarness)
        if env.get("numerics.reproducible") != "true":
            raise SystemExit(f"not pinned: {env.get('numerics.why')}")
        runs[name] = {str(s): m for s, m in sorted(metrics.items())}
    facts = {k: v for k, v in env.items() if k in (
        "numerics.fingerprint", "numerics.levels", "numerics.torch", "numerics.mkl",
        "numerics.onednn", "numerics.machine", "numerics.cpu", "numerics.cpu_flags")}
    facts["numerics.summary"] = numerics.summary({k.removeprefix("numerics."): v
                                                  for k, v in env.items()})
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"steps": STEPS, "environment": facts, "runs": runs},
                                 indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(runs)} runs x {STEPS} steps) under {facts['numerics.summary']}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/sim/test_golden.py --write")
    write()
