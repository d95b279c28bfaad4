"""Miles (radixark/miles, ``miles-rl`` 0.0.2) as a trainer: each trial is one Miles training run,
``python3 train.py ARGS`` from a Miles checkout on a Ray cluster of the pool's GPUs.

Plan time (no Miles import): :meth:`MilesTrainer.check` and friends refuse what Miles cannot
express (``flags``), :meth:`MilesTrainer.arguments` builds the exact argument list and the
trial's ``mis.yaml`` (``ablate plan --show-overrides``). The recipe is Miles' own arguments
under ``miles:`` (``recipes/miles/``), spelled as ``train.py`` takes them with ``_`` for ``-``;
the arguments this trainer sets itself (``OWNED``) may not be in it.

An attempt is a Ray job on the pool's Ray cluster (``launch``), its metrics and checkpoints
followed through the trial's ``job.MilesJob``. What runs on this CPU machine is everything up to
the command line, checked by Miles' own argument parser (``tests/miles/test_miles_parser.py``,
in the environment of ``ablate gpu-env miles``), and the launch, watch, metrics and checkpoint
hand-over around a stand-in ``train.py`` (``tests/miles/test_miles_launch.py``); a training run
needs SGLang and Megatron on GPUs.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator.backends.base import (
    PLAN,
    AttemptResult,
    Emits,
    Problem,
    RunContext,
    Trainer,
    problem,
)
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import GridError
from orchestrator.learner import rollout_for
from orchestrator.miles import events, flags, launch
from orchestrator.miles.job import MilesJob
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

SECTION = "miles"
# Arguments the trainer sets from the trial, its correction, engine and learner settings and
# the pool: a recipe that set one would be silently overridden, so it is refused.
OWNED = frozenset({
    "num_rollout", "seed", "save", "load", "save_interval", "use_tensorboard",
    "tb_project_name", "tb_experiment_name", "actor_num_nodes", "actor_num_gpus_per_node",
    "use_tis", "tis_clip", "tis_clip_low", "custom_tis_function_path", "custom_config_path",
    "use_rollout_logprobs", "get_mismatch_metrics", "true_on_policy_mode", "use_opsm",
    "opsm_delta", "use_routing_replay", "use_rollout_routing_replay", "rollout_temperature",
    "bf16", "fp16", "eps_clip", "eps_clip_high", "eps_clip_c", "calculate_per_token_loss",
    "deterministic_mode", "advantage_estimator", "train_backend",
    *(f.removeprefix("--").replace("-", "_") for f, _ in flags.SGLANG.values()),
})
# The pool's Miles settings (``miles:`` in the pool catalogue): where train.py and the MIS
# example are on its nodes, and the Ray cluster's job server.
POOL_KEYS = frozenset({"checkout", "ray_address"})


class MilesTrainer(Trainer):
    """Miles 0.0.2 (Megatron actor, SGLang rollouts) on a gpu pool."""

    SECTION: ClassVar[str] = SECTION

    name: ClassVar[str] = "miles"
    version: ClassVar[str] = "miles-0.0.2"
    pool_kinds: ClassVar[tuple[str, ...]] = ("gpu",)
    computes_elsewhere: ClassVar[bool] = True  # a Ray job on the pool's cluster (miles.launch)

    # ----------------------------------------------------------------------- plan time

    @classmethod
    def problems(cls, config: TrialConfig, *, stages: frozenset[str] = PLAN,
                 given: Iterable[tuple[str, Any]] = (), checkpoint: Path | None = None,
                 others: Iterable[PoolSpec] = ()) -> list[Problem]:
        """Why Miles cannot run a trial of ``config`` on its pool, by stage: the pool's
        ``miles:`` keys (``pool``); a gpu pool, the correction and rollout flags Miles maps, the
        MIS function's checkout, and the learner settings (``combination``); recipe values that
        are no argument of train.py (``values``); the recipe's ``miles:`` arguments (none the
        trainer owns, each a value Miles reads), the pool's GPUs for the model parallelism and
        the model the true-on-policy plan has a profile for (``config``); and a resume or rescue
        on the pool, whose GPUs must hold the recipe's model parallelism (``checkpoint``:
        Megatron's default format, torch_dist, megatron/training/training_config.py:411, is
        resharded on load; a recipe's legacy ``ckpt_format`` is not told apart here)."""
        pool, found = config.pool, []
        if "pool" in stages:
            found += [Problem("pool", why, "miles") for why in [_pool_problem(pool)] if why]
        if "combination" in stages:
            found += problem("combination", _combination_problem(config))
        if "values" in stages:
            found += problem("values", next(
                (why for key, value in given if (why := _value_problem(key, value))), None))
        if "config" in stages:
            found += problem("config", _config_problem(config))
        if "checkpoint" in stages and checkpoint is not None:
            section = config.get(SECTION)
            found += problem("checkpoint", _parallelism_problem(section, pool)
                             if isinstance(section, Mapping) else None)
        return found

    @classmethod
    def arguments(cls, trial: TrialSpec, config: TrialConfig, *, checkpoint_dir: str | None = None,
                  resume_path: str | None = None, save_freq: int | None = None,
                  mis_path: str = "mis.yaml", tensorboard_dir: str | None = None,
                  ) -> tuple[list[str], dict[str, Any] | None, dict[str, str]]:
        """(train.py's arguments, the trial's mis.yaml or None, the job's environment)."""
        pool, correction, learner = config.pool, config.correction, config.learner
        rollout = rollout_for(learner, config.rollout)
        refused = cls.problems(config, stages=frozenset({"combination", "config"}))
        if refused:
            raise GridError(f"backend 'miles' cannot run trial {trial.trial_id}: "
                            f"{refused[0].reason}", key=trial.recipe)
        out: list[str] = []
        for key, value in config[SECTION].items():
            out += _flag(key, value)
        mis = flags.mis_config(correction)
        out += flags.correction_flags(correction, mis_path if mis is not None else None)
        out += flags.rollout_flags(rollout)
        learner_args, env = flags.learner_flags(learner)
        out += learner_args
        out += ["--actor-num-nodes", str(pool.nodes),
                "--actor-num-gpus-per-node", str(pool.gpus_per_node),
                "--num-rollout", str(trial.steps), "--seed", str(trial.seed),
                "--save", checkpoint_dir or f"checkpoints/{trial.grid}/{trial.trial_id}",
                "--save-interval", str(save_freq or trial.steps),
                "--use-tensorboard", "--tb-project-name", tensorboard_dir or "tensorboard",
                "--tb-experiment-name", trial.trial_id]
        if resume_path is not None:
            out += ["--load", resume_path]
        return out, mis, env

    @classmethod
    def emits(cls, config: TrialConfig | None = None) -> Emits:
        """Every name of the vocabulary the Miles reader maps (``events``). Besides what every
        trainer's IS shares: the MIS function's metrics only where it runs, OPSM's share only
        with OPSM, the eval reward only with ``miles.eval_interval`` (train.py:136 evaluates
        only then)."""
        out = dict(super().emits(config).unemitted)
        if config is not None:
            if not flags.needs_mis(config.correction):
                out.update(dict.fromkeys(events.MIS_ONLY, (
                    "Miles reports it from its MIS function only, and this correction runs a "
                    "built-in one (token-level TIS or IcePop)")))
            if config.correction.opsm is None:
                out[M.OPSM_FRACTION] = "Miles reports opsm_clipfrac only with --use-opsm"
            section = config.get(SECTION) or {}
            if isinstance(section, Mapping) and not section.get("eval_interval"):
                out[M.EVAL_REWARD] = ("the recipe sets no miles.eval_interval, and Miles "
                                      "evaluates during training only with one (train.py:136)")
        return Emits(never=M.vocabulary() - events.EMITTED, unemitted=out)

    @classmethod
    def runs_mis(cls, config: TrialConfig) -> bool:
        """Whether the trial's correction runs Miles' MIS function (its metrics come from it)."""
        return flags.needs_mis(config.correction)

    @classmethod
    def job(cls, config: TrialConfig) -> MilesJob:
        return MilesJob(cls, config)

    @classmethod
    def require(cls, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """Launched from here: each pool names its Ray cluster, and Ray's job SDK is here."""
        launch.require(pools, where=where)

    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        return launch.run_attempt(type(self), trial, config, ctx)


def _pool_problem(pool: PoolSpec) -> str | None:
    """The pool's ``miles:`` block: known keys, each a path or address."""
    unknown = sorted(set(pool.miles) - POOL_KEYS)
    if unknown:
        return f"unknown key {unknown[0]!r} (known: {', '.join(sorted(POOL_KEYS))})"
    for key, value in pool.miles.items():
        if not isinstance(value, str) or not value:
            return f"{key}: {value!r} is not a path or address"
    return None


def _combination_problem(config: TrialConfig) -> str | None:
    """A gpu pool; the correction, rollout and learner settings Miles maps (``flags``)."""
    pool, correction, rollout, learner = (config.pool, config.correction, config.rollout,
                                          config.learner)
    if pool.kind != "gpu":
        return (f"pool {pool.name} is a {pool.kind} pool; Miles runs on gpu pools (SGLang "
                "and Megatron need CUDA)")
    found = flags.correction_problem(correction) or flags.rollout_problem(rollout)
    if found is None and flags.needs_mis(correction) and not pool.miles.get("checkout"):
        found = (f"pools.{pool.name}.miles.checkout: this correction runs Miles' MIS "
                 f"function ({flags.MIS_FILE}, not in the miles-rl wheel); fix: name the "
                 "Miles checkout on the pool's nodes as miles: {checkout: /path/to/miles}")
    if found:
        return found
    if learner.preset == "true_on_policy" and rollout.attention_backend not in (
            None, flags.TRUE_ON_POLICY_ATTENTION):
        return (f"rollout.attention_backend: {rollout.attention_backend}: Miles' "
                f"true-on-policy plan runs SGLang on {flags.TRUE_ON_POLICY_ATTENTION} "
                "(its contract's backend); fix: drop rollout.attention_backend")
    return flags.learner_problem(learner)  # the model's profile: the config stage


def _config_problem(config: TrialConfig) -> str | None:
    """The recipe's ``miles:`` arguments, the pool's GPUs for its parallelism, and the
    true-on-policy plan's model profile."""
    section = config.get(SECTION)
    if not isinstance(section, Mapping) or not section:
        return (f"{SECTION}: the recipe has no Miles arguments; fix: use a recipe under "
                "recipes/miles/ (Miles' train.py arguments under miles:)")
    for key, value in section.items():
        if key in OWNED:
            return (f"{SECTION}.{key}: the miles backend sets it itself (from the trial, "
                    "its correction/rollout/learner settings and the pool); fix: remove it")
        found = _value_problem(f"{SECTION}.{key}", value)
        if found:
            return found
    return (_parallelism_problem(section, config.pool)
            or flags.true_on_policy_problem(config.learner, section.get("model_name"),
                                            bool(section.get("sequence_parallel"))))


def _value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be one argument of Miles' argparse (a scalar, or a list of them)."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, Mapping | list) or (isinstance(item, str) and not item):
            return f"{key}: {value!r} is not a value train.py takes; fix: a scalar or a list"
        if isinstance(item, str) and "\0" in item:
            return f"{key}: contains NUL; fix: remove it"
    return None


def _flag(key: str, value: Any) -> list[str]:
    """One recipe argument: ``true`` is the bare flag, ``false``/null leave it out, a list is
    the flag's values (``eval_prompt_data: [aime, /data/aime.jsonl]``)."""
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, list):
        return [flag, *(flags.number(v) for v in value)]
    return [flag, flags.number(value)]


_MODEL_PARALLEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "context_parallel_size")


def _parallelism_problem(section: Mapping[str, Any], pool: PoolSpec) -> str | None:
    """Megatron asserts that the job's GPUs (Miles' world size: actor nodes x GPUs per node,
    miles/utils/arguments.py:1786) divide into tensor x pipeline x context parallel ranks
    (megatron/training/arguments.py:314-318); refused here at plan instead of at launch."""
    sizes = [section.get(k, 1) for k in _MODEL_PARALLEL]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
        return None  # a value Miles' parser refuses itself (_value_problem names it)
    model = sizes[0] * sizes[1] * sizes[2]
    world = pool.nodes * pool.gpus_per_node
    if world % model == 0:
        return None
    return (f"pools.{pool.name}: its {world} GPUs ({pool.nodes} node(s) x {pool.gpus_per_node}) "
            f"do not divide into the recipe's {model} model-parallel ranks (tensor "
            f"{sizes[0]} x pipeline {sizes[1]} x context {sizes[2]}; Megatron refuses such a "
            f"job); fix: a pool whose GPUs are a multiple of {model}, or smaller "
            "miles.tensor_model_parallel_size")
