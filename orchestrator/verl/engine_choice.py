"""Which rollout engine one verl trial runs, decided once (``EngineChoice.of``) and asked by
everything that depends on it: the plan-time refusals, the override table, the version, the job's
Python and environment, the provenance a finished attempt is held to, the image of its RayJob.

On a gpu pool the engine is ``rollout.engine``, else the recipe's ``actor_rollout_ref.rollout.
name`` (``engines.engine_of``), read against that engine's table (``engines.TABLES``). On a cpu
pool it is vLLM-CPU when ``rollout.engine: vllm`` asks for it (its own table, ``cpu_engines.
CPU_VLLM``, its own environment), else the project's CPU rollout engine, which maps
``rollout.dtype`` and ``temperature`` with the keys both GPU engines share (SGLang's table) and
is the pool's own ``rollout.name``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from orchestrator.engine import RolloutSpec
from orchestrator.pools import PoolSpec
from orchestrator.verl import cpu_engines, engine_versions, engines

CPU_ENGINE = "cpu"  # the project's CPU rollout engine (orchestrator/verl/cpu)
VLLM_CPU = "vllm-cpu"  # the table of vLLM on a cpu pool


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine a trial runs on ``pool`` and the flag table its ``rollout.*`` keys are read
    against. ``engine`` is None on a gpu pool whose recipe names no engine yet (plan time, before
    the trial's whole configuration is known)."""

    engine: str | None  # sglang | vllm | cpu
    table: str | None  # sglang | vllm | vllm-cpu
    pool: PoolSpec

    @classmethod
    def of(cls, rollout: RolloutSpec, pool: PoolSpec,
           config: Mapping[str, Any] | None = None) -> EngineChoice:
        """The choice for ``rollout`` on ``pool``; ``config``: the trial's resolved recipe (its
        engine when ``rollout.engine`` is unset), None where only the section is known."""
        if pool.kind == "cpu":
            if rollout.engine == "vllm":
                return cls("vllm", VLLM_CPU, pool)
            return cls(CPU_ENGINE, "sglang", pool)
        engine = engines.engine_of(rollout, config)
        name = None if engine is None else str(engine)
        return cls(name, name, pool)

    @property
    def vllm_cpu(self) -> bool:
        """vLLM on a cpu pool: its own environment, table and job variables."""
        return self.table == VLLM_CPU

    @property
    def samples_with_engine_logprobs(self) -> str | None:
        """The engine whose returned log-probs a trial trains against (``engines.
        logprob_problem``'s top-p/top-k and mode checks), or None for the CPU rollout engine,
        which returns full-vocabulary log-probs."""
        return None if self.engine == CPU_ENGINE else self.engine

    # ------------------------------------------------------------------ plan time

    def refusal(self, rollout: RolloutSpec) -> str | None:
        """What the engine's table refuses of ``rollout``'s flags, before the trial's whole
        configuration is known: on a gpu pool whose engine is not named yet, only what every
        engine refuses (the recipe's engine is checked by :meth:`problem`)."""
        if self.vllm_cpu:
            return cpu_engines.check(rollout, self.pool)
        if self.pool.kind != "gpu":
            return None
        if self.engine is not None:
            return engines.check_engine(rollout, self.engine)
        refusals = [engines.check_engine(rollout, e) for e in engines.ENGINES]
        return refusals[0] if all(refusals) else None

    def problem(self, rollout: RolloutSpec) -> str | None:
        """Once the engine is known: its environment where this machine runs it (vLLM-CPU's;
        a gpu pool's ``engine_envs``), its table's refusals and what its version does not
        apply. Where the engine is installed here without a feature, ``installed_problem``."""
        if self.vllm_cpu:
            return (cpu_engines.env_problem(self.pool)
                    or engine_versions.check_version(rollout, "vllm", self.pool))
        if self.pool.kind != "gpu":
            return None
        engine = str(self.engine)
        if engine in self.pool.engine_envs:  # the GPU stack's environment (ablate gpu-env)
            from orchestrator.verl import gpu_setup  # deferred: reads the locks, gpu pools only

            problem = gpu_setup.env_problem(engine, self.pool.name, self.pool.engine_envs[engine])
            if problem:
                return problem
        return (engines.check_engine(rollout, engine)
                or engine_versions.check_version(rollout, engine, self.pool))

    def installed_problem(self, rollout: RolloutSpec) -> tuple[str | None, str | None]:
        """(refusal, warning) of the engine installed on this machine, where this machine is
        the one that runs it (a gpu pool without ``engine_versions`` for it); (None, None)
        where the pool's image runs it."""
        if (self.pool.kind != "gpu" or self.engine is None
                or self.engine in self.pool.engine_versions):
            return None, None
        return engines.check_installed(rollout, self.engine)

    # ------------------------------------------------------------------ the job

    def overrides(self, rollout: RolloutSpec) -> list[str]:
        """verl's keys for ``rollout``'s flags on this engine (call :meth:`refusal` first)."""
        if self.vllm_cpu:
            return cpu_engines.overrides(rollout)
        if self.pool.kind == "cpu":  # rollout.engine: cpu is the pool's own rollout.name
            return engines.engine_overrides(rollout.model_copy(update={"engine": None}), "sglang")
        return engines.engine_overrides(rollout, str(self.engine))

    def job_env(self) -> dict[str, str]:
        """Variables the job's engine needs (vLLM-CPU's platform; none elsewhere)."""
        return dict(cpu_engines.JOB_ENV) if self.vllm_cpu else {}

    @property
    def provenance_engine(self) -> tuple[str, str]:
        """(the engine the job's reports name, the table they are held to)."""
        return str(self.engine), str(self.table)
