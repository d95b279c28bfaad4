"""A small deterministic trainer: a test double for the scheduler's and runner's own logic.

It trains nothing: each step's metrics are a pure function of (seed, step, config), its
checkpoint is one JSON file with the step and a running sum, so a resumed attempt continues
exactly where an uninterrupted one would be. Behaviour switches (all from the trial config):

* ``correction.is_level: none`` on pool ``sim-a100`` collapses after step 8 (grad norm x 100,
  reward to 0) -> the default verdict rules fire ``collapsed``;
* ``train.lr`` shapes the final reward (peak at 3e-3), so a search has something to find;
* env ``ABLATE_DOUBLE_STEP_S`` sets the sleep per step (default 0.02 s);
* env ``ABLATE_DOUBLE_FAIL_ONCE=<dir>``: the first attempt of each trial raises at step 7
  (a marker file in <dir> remembers it), to test retries;
* ``train.lr: 0.0666`` (a sentinel no real grid uses) makes every attempt raise at step 7, to
  test exhausted retries;
* env ``ABLATE_DOUBLE_BAD_POOL=<pool>``: every attempt on that pool raises at step 7 (a bad
  node or a pool gone), to test a rescue onto another pool once retries are spent;
* env ``ABLATE_DOUBLE_SLOW_POOL=<pool>:<seconds>``: that pool's steps take ``seconds`` each
  (one trial still running while another has ended).

Register it for a test with :func:`register` (the driver ships the (module, class) pair to Ray
workers, which import this module from ``tests/`` on their PYTHONPATH).
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends.base import AttemptOutcome, AttemptResult, RunContext, Trainer


class DoubleTrainer(Trainer):
    name = "double"
    version = "1"
    pool_kinds = ("sim",)

    def run(self, trial: Any, config: Mapping[str, Any], ctx: RunContext) -> AttemptResult:
        (ctx.workdir / "pid").write_text(str(os.getpid()))
        step, acc = 0, 0.0
        if ctx.resume_step is not None:
            state = json.loads((ctx.checkpoint_path(ctx.resume_step) / "state.json").read_text())
            step, acc = state["step"], state["acc"]
        delay = float(os.environ.get("ABLATE_DOUBLE_STEP_S", "0.02"))
        slow_pool, _, slow_s = os.environ.get("ABLATE_DOUBLE_SLOW_POOL", "").partition(":")
        if slow_pool == ctx.pool.name:
            delay = float(slow_s)
        fail_dir = os.environ.get("ABLATE_DOUBLE_FAIL_ONCE")
        lr = float(config["train"]["lr"])
        collapse = config["correction"]["is_level"] == "none" and ctx.pool.name == "sim-a100"
        quality = math.exp(-((math.log10(lr) - math.log10(3e-3)) ** 2))  # 1.0 at lr = 3e-3
        while step < trial.steps:
            if (reason := ctx.should_stop()) is not None:
                return AttemptResult(AttemptOutcome.STOPPED, step, reason)
            step += 1
            time.sleep(delay)
            if step == 7 and (lr == 0.0666 or ctx.pool.name == os.environ.get("ABLATE_DOUBLE_BAD_POOL")):
                raise RuntimeError("injected infra failure at step 7 (every attempt)")
            if fail_dir and step == 7:
                marker = Path(fail_dir) / f"{trial.trial_id}.failed"
                if not marker.exists():
                    marker.write_text("1")
                    raise RuntimeError("injected infra failure at step 7")
            broken = collapse and step > 8
            acc += 0.01 * trial.seed + step * 1e-3
            reward = 0.0 if broken else quality * (1 - math.exp(-step / 10)) + 0.001 * (acc % 1)
            ctx.log_metrics(step, {
                "critic/score/mean": reward, "eval/reward": reward,
                "actor/grad_norm": (100.0 if broken else 1.0) + 0.01 * (step % 3),
                "rollout_corr/k3_kl": 1e-4 * (1 + step % 5), "actor/entropy": 1.0,
                "acc": acc,
            })
            if step % ctx.checkpoint_every == 0:
                ctx.save_checkpoint(step, lambda d, s=step, a=acc: (d / "state.json").write_text(
                    json.dumps({"step": s, "acc": a})))
        # Resumed from a checkpoint at the last step: nothing ran, so no final reward to report.
        summary = {"eval/reward/final": reward} if step > (ctx.resume_step or 0) else {}
        return AttemptResult(AttemptOutcome.COMPLETED, step, None, summary)


def register(monkeypatch: Any) -> None:
    """Make backend ``sim`` resolve to this double in the driver (and so in Ray workers)."""
    from orchestrator import backends

    monkeypatch.setitem(backends._TRAINERS, "sim", ("doubles", "DoubleTrainer"))


def config_of(pool: Any, correction: Any = None, rollout: Any = None, learner: Any = None,
              recipe: Mapping[str, Any] | None = None) -> Any:
    """A ``TrialConfig`` on ``pool`` of these typed sections (None: the default) over
    ``recipe``: what a test asks a trainer's ``problems`` about."""
    from orchestrator.backends import TrialConfig

    sections = {name: spec.non_default() for name, spec in
                (("correction", correction), ("rollout", rollout), ("learner", learner))
                if spec is not None}
    return TrialConfig.of({**(recipe or {}), **sections}, pool)


def refusal(trainer: Any, config: Any, *stages: str, **asked: Any) -> str | None:
    """The first problem ``trainer`` (a class, or a backend) finds in ``config`` at ``stages``
    (default: ``combination``), or None."""
    found = trainer.problems(config, stages=frozenset(stages or ("combination",)), **asked)
    return found[0].reason if found else None
