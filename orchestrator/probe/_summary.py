"""A probe's figures: per configuration, each metric's mean over its (seed, batch) rows with a
t interval (``stats.intervals``), the per-probability-bucket table, and with ``--attribute``
each knob's paired change in k3, ranked.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from orchestrator import metrics as M
from orchestrator.grid import Gate
from orchestrator.probe._plan import METRICS
from orchestrator.probe._run import Measured, Rows
from orchestrator.stats.intervals import Interval, paired_difference, t_interval


@dataclasses.dataclass(frozen=True)
class Attribution:
    knob: str  # engine.kv_cache, learner.precision, pool
    change: str  # fp8->fp32, sim-a100->sim-h100
    delta: Interval  # k3 of the configuration minus k3 with the change (paired)


@dataclasses.dataclass(frozen=True)
class Summary:
    """One configuration's figures."""

    measured: Measured
    metrics: dict[str, Interval]  # METRICS key -> interval of its per-batch mean
    buckets: tuple[tuple[str, Interval, Interval], ...]  # (bucket, k3, token share)
    tokens: int
    attribution: tuple[Attribution, ...]  # ranked, largest change first
    failed: tuple[Gate, ...]

    @property
    def label(self) -> str:
        return self.measured.config.label


def _interval(rows: Rows, key: str) -> Interval:
    return t_interval([float(r[key]) for r in rows if key in r])


def _paired(rows_a: Rows, rows_b: Rows, key_a: str, key_b: str) -> Interval:
    b = {(r["seed"], r["batch"]): r[key_b] for r in rows_b}
    return paired_difference([(r[key_a], b[(r["seed"], r["batch"])]) for r in rows_a
                              if (r["seed"], r["batch"]) in b])


def _knob_delta(m: Measured, rows: Rows) -> Interval:
    """A knob's paired change in k3: against the configuration's k3 its knob job measured
    beside it (the simulator's), else against the configuration's own probe rows of the same
    seed and batch (verl's knob jobs run only the turned configuration)."""
    if rows and all("k3" in r for r in rows):
        return _paired(rows, rows, "k3", "k3_without")
    return _paired(m.rows, rows, M.K3_KL, "k3_without")


def _pool_knobs(m: Measured, others: Sequence[Measured]) -> list[Attribution]:
    """The same configuration on another probed pool: its identity but pool and engine alike."""
    def rest(x: Measured) -> dict[str, object]:
        return {k: v for k, v in x.config.identity.items() if k not in ("pool", "engine")}

    return [Attribution("pool", f"{m.config.pool.name}->{o.config.pool.name}",
                        _paired(m.rows, o.rows, M.K3_KL, M.K3_KL))
            for o in others if o is not m and o.config.pool.name != m.config.pool.name
            and rest(o) == rest(m)]


def summarise(measured: Sequence[Measured], gates: Sequence[Gate]) -> list[Summary]:
    """Every configuration's figures, gates judged on each metric's estimate."""
    out = []
    for m in measured:
        figures = {name: _interval(m.rows, key) for name, key in METRICS.items()}
        buckets = tuple((M.bucket_name(lo, hi).rsplit("/", 1)[-1].removeprefix("p_"),
                         _interval(m.rows, M.bucket_name(lo, hi)),
                         _interval(m.rows, M.bucket_count_name(lo, hi)))
                        for lo, hi in M.PROB_BUCKETS)
        attribution = [Attribution(k, change, _knob_delta(m, rows))
                       for k, (change, rows) in m.knobs.items()]
        if m.knobs:
            attribution += _pool_knobs(m, measured)
        attribution.sort(key=lambda a: -a.delta.estimate if math.isfinite(a.delta.estimate)
                         else math.inf)
        failed = tuple(g for g in gates if g.fails(figures[g.metric].estimate))
        out.append(Summary(m, figures, buckets, int(sum(r["tokens"] for r in m.rows)),
                           tuple(attribution), failed))
    return out
