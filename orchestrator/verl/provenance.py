"""What the rollout engine really ran with, read from the engine's own objects, per attempt.

In the job, :mod:`orchestrator.verl.engine_hook` (loaded by verl in every process through
``VERL_USE_EXTERNAL_MODULES``) writes one JSON line per engine start to ``ABLATE_ENGINE_LOG``:
the engine's name, version and effective settings as the engine resolved them (SGLang's
``ServerArgs`` after its own defaults, vLLM's ``VllmConfig``, the CPU engine's server). Here the
runner reads that file after the attempt, compares each requested ``rollout.*`` flag with what
the engine reports, and turns the result into attempt facts (``attempts.json`` and MLflow tags
``engine.*``) plus a warning, or, with ``rollout.provenance: strict``, an infra failure.

A flag is *unapplied* when the engine reports another value and *unconfirmed* when no engine
reported the setting (a flag verl applies outside the engine, e.g. ``free_cache_engine``, is
neither: ``VERL_SIDE``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.config import TrialConfig
from orchestrator.engine import RolloutSpec
from orchestrator.verl import cpu_engines, engines
from orchestrator.verl.engine_choice import EngineChoice

LOG_ENV = "ABLATE_ENGINE_LOG"
# verl key leaf -> the engine's own setting name, where they differ (async_sglang_server.py:318,
# 329; vllm_async_server.py:307 pops compilation_config into vLLM's cudagraph_mode).
RENAMES = {
    "sglang": {"enforce_eager": "disable_cuda_graph", "max_num_seqs": "max_running_requests"},
    "vllm": {"compilation_config": "cudagraph_mode", "hf_overrides": "head_dtype"},
    "cpu": {},
}
# Flags verl applies itself (sampling parameters per request, sleep / wake-up between phases):
# no engine setting shows them.
VERL_SIDE = ("temperature", "free_cache_engine", "weight_lag", "reduction_order",
             "sampling_seed_per_request")


@dataclass(frozen=True)
class EngineReport:
    """One engine's report: name, version and effective settings (values as text)."""

    name: str
    version: str
    settings: dict[str, str] = field(default_factory=dict)


def read_reports(path: Path) -> list[EngineReport]:
    """The engine reports of one attempt (one per engine start; torn or foreign lines skipped)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
            out.append(EngineReport(str(rec["engine"]), str(rec.get("version") or "unknown"),
                                    {str(k): text(v) for k, v in (rec.get("settings") or {}).items()}))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def text(value: Any) -> str:
    """A setting as comparable text: torch dtypes and enums by name, JSON for containers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (int, float)):
        return repr(value)
    name = str(value).strip("<>").split(":")[0].removeprefix("torch.")
    if _ENUM.fullmatch(name):  # CUDAGraphMode.PIECEWISE, AttentionBackendEnum.FLASH_ATTN
        name = name.rsplit(".", 1)[1]
    return name.lower()


_ENUM = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*")


def expected(rollout: RolloutSpec, table_engine: str, engine: str) -> dict[str, tuple[str, str]]:
    """flag -> (engine setting, expected text) for every requested flag an engine can show."""
    out: dict[str, tuple[str, str]] = {}
    renames = RENAMES.get(engine, {})
    for flag, value in rollout.requested().items():
        if flag in VERL_SIDE or flag == "engine":
            continue
        table = cpu_engines.CPU_VLLM if table_engine == "vllm-cpu" else engines.TABLES[table_engine]
        for entry in table.get(flag, ()):
            if not isinstance(entry, engines.Key):
                continue
            emit, verl_value = entry.value_for(value)
            if not emit:
                continue
            leaf = entry.key.rsplit(".", 1)[-1]
            if leaf == "compilation_config":
                verl_value = json.loads(verl_value)["cudagraph_mode"]
            elif leaf == "hf_overrides":
                verl_value = verl_value["head_dtype"]
            out[flag] = (renames.get(leaf, leaf), text(verl_value))
    return out


@dataclass(frozen=True)
class Provenance:
    """The comparison of one attempt: facts to record and what was not applied."""

    facts: dict[str, str]
    unapplied: list[str]
    unconfirmed: list[str]

    def warning(self) -> str | None:
        parts = []
        if self.unapplied:
            parts.append("the engine did not apply " + "; ".join(self.unapplied))
        if self.unconfirmed:
            parts.append("no engine report confirms " + ", ".join(self.unconfirmed))
        return "; ".join(parts) or None


def compare(rollout: RolloutSpec, reports: Iterable[EngineReport], *, table_engine: str,
            engine: str) -> Provenance:
    """Requested flags against every engine report of the attempt (all replicas must agree)."""
    reports = [r for r in reports if r.name == engine]
    facts = {"engine.name": engine,
             "engine.version": ",".join(sorted({r.version for r in reports})) or "unreported",
             "engine.reports": str(len(reports))}
    if reports:
        for key, value in sorted(reports[0].settings.items()):
            facts[f"engine.ran.{key}"] = value[:250]
    unapplied, unconfirmed = [], []
    for flag, (setting, want) in expected(rollout, table_engine, engine).items():
        seen = {r.settings[setting] for r in reports if setting in r.settings}
        if not seen:
            unconfirmed.append(f"rollout.{flag}")
        elif seen != {want}:
            unapplied.append(f"rollout.{flag} (asked {setting}={want}, engine ran "
                             f"{'/'.join(sorted(seen))})")
    facts["engine.unapplied"] = ", ".join(unapplied) or "none"
    facts["engine.unconfirmed"] = ", ".join(unconfirmed) or "none"
    return Provenance(facts, unapplied, unconfirmed)


def attempt_provenance(config: TrialConfig, path: Path) -> tuple[Provenance, bool]:
    """(provenance, strict) of one verl attempt from its engine log, held to the table of the
    engine the trial runs (``engine_choice``)."""
    rollout = config.rollout
    engine, table_engine = EngineChoice.of(rollout, config.pool, config).provenance_engine
    prov = compare(rollout, read_reports(path), table_engine=table_engine, engine=engine)
    return prov, rollout.provenance == "strict"
