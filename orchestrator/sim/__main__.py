"""Run one simulator trial directly, for debugging: ``python -m orchestrator.sim --pool sim-h100``.

Prints one line per ``--every`` steps and a summary; checkpoints go under ``--workdir``.
Example: ``python -m orchestrator.sim --pool sim-a100 --steps 300 --set correction.is_level=token``.
Runs with pinned CPU numerics unless ``--set sim.reproducible=false``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from orchestrator import metrics as M
from orchestrator import recipes
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import UserError
from orchestrator.pools import load_catalog
from orchestrator.sim import numerics
from orchestrator.sim.config import reproducible
from orchestrator.sim.job import SimTrainer
from orchestrator.sim.local import LocalContext, make_trial


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.sim", description=__doc__)
    ap.add_argument("--recipe", default="sim/grpo_tiny")
    ap.add_argument("--pool", default="sim-h100")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume-step", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--every", type=int, default=10, help="print every N steps")
    args = ap.parse_args(argv)
    try:
        overrides = recipes.parse_assignments(args.set)
        base = recipes.compose_recipe(args.recipe, root=recipes.recipes_root())
        for section, model in (("correction", CorrectionSpec), ("rollout", RolloutSpec)):
            base[section] = {**model().model_dump(mode="json"), **(base.get(section) or {})}
        config = recipes.apply_overrides(base, overrides)
        numerics.apply(reproducible(config))  # torch is not imported yet in this process
        pool = load_catalog().get(args.pool)
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sim-trial-"))
        trial = make_trial(args.pool, args.steps, args.seed, overrides, args.recipe)

        def show(step: int, m: object) -> None:
            if step % args.every == 0 or step == args.steps:
                print(f"step {step:4d} reward {m[M.TRAIN_REWARD]:.3f} "  # type: ignore[index]
                      f"eval {m.get(M.EVAL_REWARD, float('nan')):.3f} k3 {m[M.K3_KL]:.2e} "  # type: ignore[attr-defined]
                      f"entropy {m[M.ENTROPY]:.2f} grad_norm {m[M.GRAD_NORM]:.2f} "  # type: ignore[index]
                      f"{m[M.TIME_PER_STEP] * 1e3:.0f} ms", flush=True)  # type: ignore[index]

        ctx = LocalContext(trial=trial, pool=pool, workdir=workdir,
                           checkpoint_every=args.checkpoint_every,
                           resume_step=args.resume_step, on_step=show)
        t0 = time.perf_counter()
        result = SimTrainer().run(trial, config, ctx)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{result.outcome.value} at step {result.last_step} in {time.perf_counter() - t0:.1f} s"
          + (f": {result.reason}" if result.reason else "") + f"; workdir {workdir}")
    env = ctx.environment
    print("numerics: " + ("pinned (" + env.get("numerics.levels", "") + ")"
                          if env.get("numerics.reproducible") == "true"
                          else "not pinned: " + env.get("numerics.why", "?")))
    return 0 if result.outcome.value != "numeric_failure" else 1


if __name__ == "__main__":
    sys.exit(main())
