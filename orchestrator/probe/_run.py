"""Running a plan's probe jobs, each once: a probe's record is kept under the workdir by its
content hash (``<workdir>/probes/<id>.json``), so a second probe of the same grid, or of another
grid with the same configuration, runs nothing new.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.backends import backend
from orchestrator.backends.base import ProbeJob
from orchestrator.cost import pool_rate
from orchestrator.exceptions import StateFileError
from orchestrator.probe._plan import SCHEME, Configuration, Plan, digest
from orchestrator.store import atomic_write_json, probe_ledger, read_json, workspace

Rows = list[dict[str, float]]


@dataclasses.dataclass
class Measured:
    """One configuration's probe: its rows and engine settings, and its knobs' paired rows."""

    config: Configuration
    rows: Rows
    engine: dict[str, Any]
    seconds: float  # the job's wall time (as first run)
    cached: bool
    knobs: dict[str, tuple[str, Rows]] = dataclasses.field(default_factory=dict)  # name -> (change, rows)
    knob_seconds: float = 0.0  # the knob jobs' wall time (as first run)
    ran_seconds: float = 0.0  # the wall time of the jobs this invocation ran (0: all cached)

    @property
    def cost(self) -> tuple[float, str]:
        """Accelerator-hours of its jobs at its pool's rate (``cost.pool_rate``), and the unit."""
        accelerators, unit = pool_rate(self.config.pool)
        return accelerators * (self.seconds + self.knob_seconds) / 3600, unit


def probe_dir(workdir: str | None) -> Path:
    return workspace.workdir(workdir) / "probes"


def _cached(path: Path, make: Any) -> tuple[dict[str, Any], bool]:
    if path.is_file():
        return read_json(path), True
    t0 = time.perf_counter()
    record = make()
    record["seconds"] = time.perf_counter() - t0
    atomic_write_json(path, record)
    return record, False


def run_plan(plan: Plan, *, workdir: str | None, attribute: bool) -> list[Measured]:
    """Every configuration of ``plan`` probed (from the cache where it was), with its knobs'
    probes when ``attribute``; in the grid's trainer's worker environment (pinned numerics)."""
    out_dir = probe_dir(workdir)
    runs = backend(plan.grid.backend)
    seeds, batches = list(plan.seeds), plan.batches
    measured = []
    for c in plan.configurations:
        job = c.job()
        # A job that runs a trainer (verl's) keeps its scratch and logs under the workdir.
        env = {**runs.worker_env(c.config), "ABLATE_WORKDIR": str(workspace.workdir(workdir))}
        with workspace.scoped_environ(env):
            def make(c: Configuration = c, job: Any = job) -> dict[str, Any]:
                rows, engine = job.run(c.trial, c.config, c.pool, seeds, batches)
                return {"probe_id": c.probe_id, "identity": c.identity, "seeds": seeds,
                        "batches": batches, "rows": rows, "engine": engine}

            record, cached = _cached(out_dir / f"{c.probe_id}.json", make)
            m = Measured(c, record["rows"], record["engine"], record["seconds"], cached,
                         ran_seconds=0.0 if cached else record["seconds"])
            if attribute:
                _knobs(job, c, m, out_dir, seeds, batches)
        measured.append(m)
    return measured


def _knobs(job: ProbeJob, c: Configuration, m: Measured, out_dir: Path, seeds: list[int],
           batches: int) -> None:
    """The configuration's knob probes into ``m.knobs``: the cached ones read, the others run
    in one job and kept, each under its own content hash."""
    changes = c.job.knobs(c.config, c.pool)
    ids = {k: digest({"scheme": SCHEME, "probe": c.job.version, "knob": k, "identity": c.identity,
                      "config": c.config.recipe, "seeds": seeds, "batches": batches})
           for k in changes}
    records = {k: read_json(out_dir / f"{i}.json") for k, i in ids.items()
               if (out_dir / f"{i}.json").is_file()}
    todo = [k for k in changes if k not in records]
    if todo:
        t0 = time.perf_counter()
        made = job.run_knobs(c.trial, c.config, c.pool, seeds, batches, todo)
        took = time.perf_counter() - t0
        share = took / len(todo)  # one job ran them all
        m.ran_seconds += took
        for k in todo:
            records[k] = {"probe_id": ids[k], "knob": k, "rows": made[k], "seconds": share}
            atomic_write_json(out_dir / f"{ids[k]}.json", records[k])
        m.cached = False
    m.knobs = {k: (changes[k], records[k]["rows"]) for k in changes}
    m.knob_seconds = sum(float(records[k].get("seconds", 0.0)) for k in changes)


def record_spent(grid_dir: Path, measured: list[Measured]) -> None:
    """Add what this invocation's probe jobs cost to the grid's ledger (``store.probe_ledger``),
    which ``ablate compare``'s cost table and the grid's budget read. A probe read from the
    cache adds nothing: its hours were spent once, by the grid whose probe ran it (or again, if
    its record was deleted and it ran again)."""
    try:
        entries = probe_ledger.read(grid_dir)
    except StateFileError as exc:  # the probe's own records are intact: the ledger starts again
        print(f"warning: {exc}; writing it again from this probe", file=sys.stderr)
        entries = {}
    for m in measured:
        if m.ran_seconds <= 0 and m.config.probe_id in entries:
            continue
        accelerators, unit = pool_rate(m.config.pool)
        old = entries.get(m.config.probe_id, {"hours": 0.0, "runs": 0})
        entries[m.config.probe_id] = {
            "label": m.config.label, "pool": m.config.pool.name, "unit": unit,
            "hours": float(old["hours"]) + accelerators * m.ran_seconds / 3600,
            "runs": int(old.get("runs", 0)) + (m.ran_seconds > 0)}
    probe_ledger.write(grid_dir, entries)
