"""What ``ablate probe`` runs: a grid's trials grouped into the configurations that decide
mismatch (each trainer's ``ProbeJob.identity``), the ones it cannot probe with why, and the
``--gate`` bounds, all decided before anything runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from orchestrator import metrics as M
from orchestrator.backends import TrialConfig, backend
from orchestrator.backends.base import ProbeJob
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.grid import GridSpec, expand
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

SCHEME = 1  # the probe id's scheme: bump when what it hashes changes
METRICS = M.PROBE_METRICS  # the per-configuration metrics a probe reports


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration a probe measures: the trials that share its mismatch identity."""

    probe_id: str
    label: str  # the axis values its trials share (``pool=sim-a100``)
    pool: PoolSpec
    trial: TrialSpec  # the first of its trials: the config a probe job runs
    config: TrialConfig
    identity: dict[str, Any]
    trials: tuple[str, ...]
    job: type[ProbeJob]


@dataclasses.dataclass(frozen=True)
class Plan:
    grid: GridSpec
    configurations: tuple[Configuration, ...]
    refused: tuple[tuple[str, str], ...]  # (label, why) of configurations it cannot probe
    seeds: tuple[int, ...]
    batches: int


def digest(data: Any) -> str:
    """``p`` + 12 hex digits of SHA-256 over canonical JSON (a probe's content hash)."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return "p" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _label(trials: Sequence[TrialSpec]) -> str:
    shared = set(trials[0].axes).intersection(*(set(t.axes) for t in trials[1:]))
    parts = [f"{k}={v}" for k, v in trials[0].axes if (k, v) in shared]
    return " ".join(parts) or f"pool={trials[0].pool}"


def plan(grid: GridSpec, *, pools: Sequence[str] = (), batches: int = 4,
         seeds: Sequence[int] = ()) -> Plan:
    """Group ``grid``'s trials (on ``pools`` only, if given) into probe configurations."""
    trials = expand(grid)
    known = {t.pool for t in trials}
    for name in pools:
        if name not in known:
            hint = did_you_mean(name, sorted(known))
            raise UserError(f"{grid.file}: --pools {name}: no trial of grid {grid.name} runs "
                            f"there; its pools: {', '.join(sorted(known))}"
                            + (f"; did you mean {hint}?" if hint else ""))
    if batches < 2:
        raise UserError(f"--batches {batches}: an interval needs at least 2 batches")
    chosen_seeds = tuple(seeds) or tuple(dict.fromkeys(grid.spec.seed_values))
    groups: dict[str, list[TrialSpec]] = {}
    meta: dict[str, tuple[PoolSpec, TrialConfig, dict[str, Any], type[ProbeJob]]] = {}
    refused: dict[str, str] = {}
    runs = backend(grid.backend)
    for trial in trials:
        if pools and trial.pool not in pools:
            continue
        pool = grid.pools.get(trial.pool)
        config = grid.trial_config(trial)
        job = runs.probe_job(pool)
        # Whether the machine can run the job is asked where it runs: here before anything
        # starts, or (a launcher that computes elsewhere: Slurm) on the pool's node, by the job.
        why = (f"the {runs.trainer(pool).name} probe is not implemented yet" if job is None
               else None if runs.launcher.computes_elsewhere else job.check(config, pool))
        if why:  # a trainer without a probe: said once per pool
            refused.setdefault(f"pool={trial.pool}" if job is None else _label([trial]), why)
            continue
        assert job is not None
        identity = job.identity(config, pool)
        pid = digest({"scheme": SCHEME, "probe": job.version, "identity": identity,
                      "seeds": chosen_seeds, "batches": batches})
        groups.setdefault(pid, []).append(trial)
        meta.setdefault(pid, (pool, config, identity, job))
    configs = tuple(Configuration(pid, _label(ts), meta[pid][0], ts[0], meta[pid][1],
                                  meta[pid][2], tuple(t.trial_id for t in ts), meta[pid][3])
                    for pid, ts in groups.items())
    return Plan(grid, configs, tuple(refused.items()), chosen_seeds, batches)
