"""The verl trainer's probe job (``backends.base.ProbeJob``): a configuration's mismatch at its
first steps, measured by a short verl 0.9.1 run of the trial's own configuration that learns
nothing.

The job is the trial's job (``VerlTrainer.run``: its overrides, the pool's platform and rollout
engine, ``supervise.run_attempt``'s own Ray, reaping and engine provenance), run for ``batches``
steps per seed with

* the actor's learning rate 0: verl's FSDP optimizer is torch's AdamW with a constant schedule
  (``verl/trainer/config/optim/fsdp.yaml``: ``lr_scheduler_type: constant``, no warmup; verl only
  asserts that ``lr`` is set, ``verl/workers/config/optimizer.py:58``), whose step moves a
  parameter by ``lr`` times its update and decays it by ``1 - lr * weight_decay``
  (``torch/optim/adam.py:419, 498``, torch 2.13): with lr 0 every step samples with the initial
  weights, so batch ``b`` of seed ``s`` is the rollout of step ``b`` of seed ``s``'s trial
  (``data.seed``) with the weights of its step 1;
* the correction replaced by none in decoupled mode: verl's driver then recomputes the old
  log-probs with the trainer and logs ``rollout_corr/*`` (``compute_offpolicy_metrics``,
  ``verl/trainer/ppo/rollout_corr_helper.py:904-1001``; called in decoupled mode only,
  ``ray_trainer.py:1647-1660``): those are the figures read here, per step;
* no validation and no checkpoint (they do not enter the mismatch);
* verl's driver made to write each step's token-level figures (``probe/verl_tokens.py``): verl
  reports its mismatch as batch means (k3, k1, chi-square, read from its metrics), so
  |log mu - log pi| max and quantiles, the bitwise-equal share, the token count and the
  per-probability buckets come from the two log-prob tensors verl's own off-policy metrics are
  computed from, by the simulator probe's formulas.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator.backends.base import ProbeJob
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import BackendUnavailableError, InfraFailure
from orchestrator.pools import PoolSpec
from orchestrator.probe import verl_tokens
from orchestrator.store import workspace
from orchestrator.trial import TrialSpec
from orchestrator.verl.topology import config_value

VERSION = "verl-probe-2"  # bump when a probe's numbers would change (part of its content hash)
# Keys of the trial's configuration that do not change the log-probs of a run that learns
# nothing (left out of a probe's identity): the optimizer, the loss, validation, checkpoints.
NOT_MISMATCH = ("actor_rollout_ref.actor.optim", "actor_rollout_ref.actor.entropy_coeff",
                "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "trainer.test_freq", "trainer.val_before_train", "trainer.save_freq",
                "trainer.max_actor_ckpt_to_keep")
LEARNER_LOSS = ("loss", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")
# The probe's figures read from each verl step (``metrics.PROBE_METRICS`` values); the token-level
# ones come from ``verl_tokens``.
READ = (M.K3_KL, M.K1_KL, M.CHI2_TOKEN)
MODULES = "VERL_USE_EXTERNAL_MODULES"


def job_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration a probe job runs: the trial's, learning nothing (module docstring)."""
    out = copy.deepcopy({k: v for k, v in config.items() if k not in ("correction", "eval")})
    out["correction"] = {}  # none, decoupled: the driver recomputes and logs rollout_corr/*
    actor = out.setdefault("actor_rollout_ref", {}).setdefault("actor", {})
    actor["optim"] = {**(actor.get("optim") or {}), "lr": 0.0}
    out["trainer"] = {**(out.get("trainer") or {}), "test_freq": -1, "val_before_train": False}
    return out


def _without(config: Mapping[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = config
    for p in parents:
        node = node.get(p) if isinstance(node, Mapping) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


class VerlProbe(ProbeJob):
    """Probes of verl configurations: a verl job per seed on this machine (the pool's devices:
    a cpu pool here, a gpu pool on one of its nodes)."""

    version: ClassVar[str] = VERSION

    @classmethod
    def check(cls, config: Mapping[str, Any], pool: PoolSpec) -> str | None:
        """Whether this machine can run the job (the engine reference's need: ``require_here``);
        what the trial itself cannot run was refused when the grid expanded."""
        from orchestrator.verl.reference_job import (
            require_here,  # verl's package, for verl probes only
        )

        try:
            require_here(pool, config, where=f"pool {pool.name}")
        except BackendUnavailableError as exc:
            return str(exc)
        return None

    @classmethod
    def identity(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, Any]:
        from orchestrator.verl import cpu_engines  # verl's package, for verl probes only
        from orchestrator.verl.engine_choice import EngineChoice
        from orchestrator.verl.trainer import VerlTrainer

        job = job_config(config)
        for key in NOT_MISMATCH:
            _without(job, key)
        job.pop("correction")
        job["learner"] = {k: v for k, v in (job.get("learner") or {}).items()
                          if k not in LEARNER_LOSS}
        version = (cpu_engines.installed_version(pool)
                   if EngineChoice.of(config.rollout, pool).vllm_cpu else None)
        return {"trainer": VerlTrainer.version, "pool": pool.name,
                "pool_settings": {"verl_overrides": pool.verl_overrides,
                                  "verl_env": pool.verl_env, "gpus_per_node": pool.gpus_per_node,
                                  "nodes": pool.nodes, "engine_versions": pool.engine_versions},
                "engine_version": version, "config": job}

    @classmethod
    def knobs(cls, config: Mapping[str, Any], pool: PoolSpec) -> dict[str, str]:
        """``--attribute``'s knobs (``KNOBS``) this configuration sets away from the fp32
        trainer's arithmetic, each offered only where verl runs the configuration with it turned."""
        from orchestrator.verl.trainer import VerlTrainer  # verl's package, for verl probes only

        cfg = _typed(config, pool)
        now = {"rollout.dtype": rollout_dtype(cfg), "learner.precision": cfg.learner.precision,
               "rollout.enforce_eager": cfg.rollout.enforce_eager}
        out = {}
        for knob, turned in KNOBS.items():
            if now[knob] is None or now[knob] == turned:
                continue
            if not VerlTrainer.problems(cfg.updated({knob: turned})):
                out[knob] = f"{_shown(now[knob])}->{_shown(turned)}"
        return out

    def run(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
            seeds: list[int], batches: int) -> tuple[list[dict[str, float]], dict[str, Any]]:
        return _probe(trial, config, pool, seeds, batches)

    def run_knobs(self, trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec,
                  seeds: list[int], batches: int,
                  knobs: list[str]) -> dict[str, list[dict[str, float]]]:
        """Per knob, the verl probe of the configuration with that knob turned (``KNOBS``):
        ``k3_without`` per (seed, batch). The configuration's own k3 of the same seed and batch
        (its own probe: same prompts, same initial weights, lr 0) pairs with it, so the knob
        jobs do not measure the configuration again."""
        cfg = _typed(config, pool)
        out = {}
        for knob in knobs:
            rows, _ = _probe(trial, cfg.updated({knob: KNOBS[knob]}), pool, seeds, batches,
                             knob=knob)
            out[knob] = [{"seed": r["seed"], "batch": r["batch"], "k3_without": r[M.K3_KL]}
                         for r in rows]
        return out


# The knobs ``--attribute`` turns on verl, each to the fp32 trainer's arithmetic: the dtype the
# rollout engine computes in (the grid's ``rollout.dtype``, else the pool's ``verl_overrides``,
# else the recipe's), the trainer's precision, vLLM's compiled graphs (eager, as seed 000 ran).
KNOBS: dict[str, Any] = {"rollout.dtype": "fp32", "learner.precision": "fp32",
                         "rollout.enforce_eager": True}
ROLLOUT_DTYPE = "actor_rollout_ref.rollout.dtype"
VERL_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # verl's name -> the grid's


def rollout_dtype(config: TrialConfig) -> str | None:
    """The dtype verl's rollout computes in for ``config``, in the grid's words: the grid's
    ``rollout.dtype``, else the pool's ``verl_overrides``, else the recipe's (the order in which
    ``VerlTrainer.overrides`` lets each replace the one before)."""
    if config.rollout.dtype is not None:
        return config.rollout.dtype
    pooled = {k.lstrip("+"): v for k, v in config.pool.verl_overrides.items()}
    value = pooled.get(ROLLOUT_DTYPE, config_value(config, ROLLOUT_DTYPE))
    return None if value is None else VERL_DTYPES.get(str(value), str(value))


def _typed(config: Mapping[str, Any], pool: PoolSpec) -> TrialConfig:
    """``config`` as the one type (the probe's callers pass a ``TrialConfig`` already)."""
    return config if isinstance(config, TrialConfig) else TrialConfig.of(config, pool)


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _probe(trial: TrialSpec, config: Mapping[str, Any], pool: PoolSpec, seeds: list[int],
           batches: int, knob: str = "") -> tuple[list[dict[str, float]], dict[str, Any]]:
    """The rows of ``config``'s probe (``knob``: the knob it has turned), a verl job per seed,
    and the engine's settings."""
    # The job's driver loads verl_tokens beside the pool's own modules (verl_env).
    modules = pool.verl_env.get(MODULES) or os.environ.get(MODULES)
    pool = pool.model_copy(update={"verl_env": {
        **pool.verl_env, MODULES: ",".join(filter(None, (modules, verl_tokens.__name__)))}})
    config = TrialConfig.of(job_config(config), pool)
    rows: list[dict[str, float]] = []
    settings: dict[str, Any] = {}
    for seed in seeds:
        steps, tokens, facts = _job(dataclasses.replace(trial, seed=seed, steps=batches),
                                    config, pool, knob)
        for b in range(1, batches + 1):
            m = steps.get(b)
            if m is None or M.K3_KL not in m:
                raise InfraFailure(f"the verl probe job of trial {trial.trial_id} (seed "
                                   f"{seed}) logged no {M.K3_KL} at step {b}")
            # the token count is verl_tokens' exact one, with the token-level figures
            rows.append({"seed": seed, "batch": b, **{k: m[k] for k in READ if k in m},
                         **tokens[b - 1], "wall_s": m.get("timing_s/step", math.nan)})
        settings = settings or {k: v for k, v in sorted(facts.items())
                                if k.startswith("engine.") or k == "verl.rollout"}
    return rows, settings


def _job(trial: TrialSpec, config: TrialConfig, pool: PoolSpec, knob: str = ""
         ) -> tuple[dict[int, dict[str, float]], list[dict[str, float]], dict[str, str]]:
    """One verl job of ``trial``'s steps: its metrics by step, each step's token-level figures
    (``verl_tokens``) and its facts (the engine that ran). Its scratch under
    ``<workdir>/probes/jobs`` is removed after it; its logs are kept under
    ``<workdir>/probes/logs/<trial>-s<seed>`` (a knob's job: ``...-<knob>``)."""
    from orchestrator.verl.reference_job import _JobContext  # verl's package, for verl probes only
    from orchestrator.verl.trainer import VerlTrainer

    root = workspace.workdir() / "probes"
    name = f"{trial.trial_id}-s{trial.seed}" + (f"-{knob}" if knob else "")
    scratch, logs = root / "jobs" / name, root / "logs" / name
    shutil.rmtree(scratch, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    tokens_log = logs / "tokens.jsonl"
    tokens_log.unlink(missing_ok=True)
    ctx = _JobContext(trial, pool, scratch, logs, Path(), None,  # type: ignore[arg-type]
                      workspace.grid_dir(trial.grid))
    try:
        with workspace.scoped_environ({verl_tokens.LOG_ENV: str(tokens_log)}):
            result = VerlTrainer().run(trial, config, ctx)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if result.last_step < trial.steps:
        raise InfraFailure(f"the verl probe job of trial {trial.trial_id} (seed {trial.seed}) "
                           f"ended at step {result.last_step} of {trial.steps}: {result.reason}; "
                           f"see {logs}")
    tokens = verl_tokens.read(tokens_log)
    if len(tokens) != trial.steps:
        raise InfraFailure(f"the verl probe job of trial {trial.trial_id} (seed {trial.seed}) "
                           f"recorded the token-level figures of {len(tokens)} of its "
                           f"{trial.steps} steps (verl's rollout_corr_helper."
                           f"compute_offpolicy_metrics, wrapped by {verl_tokens.__name__}); "
                           f"see {logs}")
    return ctx.metrics, [{k: v for k, v in line.items() if k != "pid"} for line in tokens], \
        ctx.facts
