"""What ``ablate probe`` runs: a grid's trials grouped into the configurations that decide
mismatch (each trainer's ``ProbeJob.identity``), the ones it cannot probe with why, and the
``--gate`` bounds, all decided before anything runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from orchestrator import metrics as M
from orchestrator.backends import backend
from orchestrator.backends.base import ProbeJob
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.grid import GridSpec, expand
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

SCHEME = 1  # the probe id's scheme: bump when what it hashes changes
# The per-configuration metrics a probe reports (its table's columns and --gate's names), each
# from one per-batch value; the trials' shared names are accepted too.
METRICS: dict[str, str] = {
    "k3": M.K3_KL, "k1": M.K1_KL, "chi2": M.CHI2_TOKEN, "abs_diff_max": "abs_diff_max",
    "abs_diff_p50": "abs_diff_p50", "abs_diff_p90": "abs_diff_p90",
    "abs_diff_p99": "abs_diff_p99", "bitwise_share": "bitwise_share", "tokens": "tokens",
    "wall_s": "wall_s",
}
_GATE = re.compile(r"^\s*([\w./\-]+)\s*(<=|>=)\s*(\S+)\s*$")


@dataclasses.dataclass(frozen=True)
class Gate:
    """``METRIC<=BOUND`` (or ``>=``): a configuration whose estimate is beyond fails."""

    metric: str  # a key of METRICS
    op: str
    bound: float

    def fails(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        return value > self.bound if self.op == "<=" else value < self.bound

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_gate(text: str, where: str = "--gate") -> Gate:
    """One ``--gate`` value; a malformed one, an unknown metric or a bound that is not a
    number is a one-line UserError."""
    m = _GATE.match(text)
    if not m:
        raise UserError(f"{where} {text!r}: expected METRIC<=BOUND (or METRIC>=BOUND), e.g. "
                        "k3<=0.01")
    name, op, raw = m.groups()
    by_vocab = {v: k for k, v in METRICS.items()}
    metric = name if name in METRICS else by_vocab.get(name)
    if metric is None:
        hint = did_you_mean(name, list(METRICS))
        raise UserError(f"{where} {text!r}: unknown metric {name!r}; allowed: "
                        f"{', '.join(METRICS)}" + (f"; did you mean {hint}?" if hint else ""))
    try:
        bound = float(raw)
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound):
        raise UserError(f"{where} {text!r}: the bound {raw!r} is not a finite number")
    return Gate(metric, op, bound)


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration a probe measures: the trials that share its mismatch identity."""

    probe_id: str
    label: str  # the axis values its trials share (``pool=sim-a100``)
    pool: PoolSpec
    trial: TrialSpec  # the first of its trials: the config a probe job runs
    config: dict[str, Any]
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
    meta: dict[str, tuple[PoolSpec, dict[str, Any], dict[str, Any], type[ProbeJob]]] = {}
    refused: dict[str, str] = {}
    runs = backend(grid.backend)
    for trial in trials:
        if pools and trial.pool not in pools:
            continue
        pool = grid.pools.get(trial.pool)
        config = grid.trial_config(trial)
        job = runs.probe_job(pool)
        why = (f"the {runs.trainer(pool).name} probe is not implemented yet" if job is None
               else job.check(config, pool))
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
