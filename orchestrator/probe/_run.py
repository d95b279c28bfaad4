"""Running a plan's probe jobs, each once: a probe's record is kept under the workdir by its
content hash (``<workdir>/probes/<id>.json``), so a second probe of the same grid, or of another
grid with the same configuration, runs nothing new.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from orchestrator.backends import backend
from orchestrator.backends.short import RESULT, ShortJob, clear
from orchestrator.cost import pool_rate
from orchestrator.exceptions import StateFileError
from orchestrator.probe import job as probe_job
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


@dataclasses.dataclass
class _Work:
    """A configuration's records: read from the cache, or made by the jobs ``run_plan`` runs."""

    config: Configuration
    record: dict[str, Any] | None  # the probe's record, None until its job ran
    changes: dict[str, str]  # knob -> the change its probe makes (``--attribute``)
    knob_ids: dict[str, str]  # knob -> its probe id
    knobs: dict[str, dict[str, Any]]  # knob -> its record, as far as cached or made
    ran_seconds: float = 0.0
    made: bool = False  # a job of this invocation made one of its records


def run_plan(plan: Plan, *, workdir: str | None, attribute: bool) -> list[Measured]:
    """Every configuration of ``plan`` probed (from the cache where it was), with its knobs'
    probes when ``attribute``. What is not cached runs as short jobs of the grid's launcher
    (``Launcher.run_short``: here, one after another; on Slurm, a job each on the pool's
    partition, in parallel within the grid's ``budget``), each under its trainer's
    environment (pinned numerics)."""
    out_dir = probe_dir(workdir)
    runs = backend(plan.grid.backend)
    seeds, batches = list(plan.seeds), plan.batches
    works, jobs = [], []
    for c in plan.configurations:
        cached = out_dir / f"{c.probe_id}.json"
        work = _Work(c, read_json(cached) if cached.is_file() else None, {}, {}, {})
        if work.record is None:
            jobs.append(_job(runs, c, c.probe_id, out_dir, workdir,
                             probe_job.task(c.job, c.trial, c.config, seeds, batches)))
        if attribute:
            work.changes = c.job.knobs(c.config, c.pool)
            work.knob_ids = {k: digest({"scheme": SCHEME, "probe": c.job.version, "knob": k,
                                        "identity": c.identity, "config": c.config.recipe,
                                        "seeds": seeds, "batches": batches})
                             for k in work.changes}
            work.knobs = {k: read_json(out_dir / f"{i}.json") for k, i in work.knob_ids.items()
                          if (out_dir / f"{i}.json").is_file()}
            todo = [k for k in work.knob_ids if k not in work.knobs]
            if todo:  # one job runs them all
                jobs.append(_job(runs, c, f"{c.probe_id}-knobs", out_dir, workdir,
                                 probe_job.task(c.job, c.trial, c.config, seeds, batches, todo)))
        works.append(work)
    budget = plan.grid.spec.budget
    try:
        runs.launcher.run_short(jobs, parallel=budget.max_parallel, limits=budget.per_pool)
    finally:  # what the jobs that ended well made is kept, even if another failed
        for w in works:
            _keep(w, out_dir, seeds, batches)
        with contextlib.suppress(OSError):  # empty once every job's result is kept
            (out_dir / "tasks").rmdir()
    return [_measured(w) for w in works]


def _job(runs: Any, c: Configuration, name: str, out_dir: Path, workdir: str | None,
         task: dict[str, Any]) -> ShortJob:
    """A probe job of ``c`` (its task written): under its trainer's environment, and where a
    job that runs a trainer (verl's) keeps its scratch and logs: the workdir."""
    job_dir = out_dir / "tasks" / name
    job_dir.mkdir(parents=True, exist_ok=True)
    clear(job_dir)  # an earlier try's result or error
    atomic_write_json(job_dir / probe_job.TASK, task)
    env = {**runs.trainer(c.pool).environment(c.config),
           "ABLATE_WORKDIR": str(workspace.workdir(workdir))}
    return ShortJob(name, c.config, env, job_dir, probe_job.__name__)


def _keep(work: _Work, out_dir: Path, seeds: list[int], batches: int) -> None:
    """The results of ``work``'s jobs that ended well, kept under their content hashes (their
    task folders removed); a job that failed leaves its folder, with its log, as evidence."""
    c, tasks = work.config, out_dir / "tasks"
    if work.record is None and (tasks / c.probe_id / RESULT).is_file():
        made = read_json(tasks / c.probe_id / RESULT)
        work.record = {"probe_id": c.probe_id, "identity": c.identity, "seeds": seeds,
                       "batches": batches, "rows": made["rows"], "engine": made["engine"],
                       "seconds": made["seconds"], "ran_on": made.get("ran_on")}
        atomic_write_json(out_dir / f"{c.probe_id}.json", work.record)
        work.ran_seconds += float(made["seconds"])
        work.made = True
        shutil.rmtree(tasks / c.probe_id, ignore_errors=True)
    knobs_dir = tasks / f"{c.probe_id}-knobs"
    todo = [k for k in work.knob_ids if k not in work.knobs]
    if todo and (knobs_dir / RESULT).is_file():
        made = read_json(knobs_dir / RESULT)
        share = float(made["seconds"]) / len(todo)
        work.ran_seconds += float(made["seconds"])
        for k in todo:
            work.knobs[k] = {"probe_id": work.knob_ids[k], "knob": k,
                             "rows": made["knobs"][k], "seconds": share,
                             "ran_on": made.get("ran_on")}
            atomic_write_json(out_dir / f"{work.knob_ids[k]}.json", work.knobs[k])
        work.made = True
        shutil.rmtree(knobs_dir, ignore_errors=True)


def _measured(work: _Work) -> Measured:
    """The configuration's measurement from its records (read from the cache or just made)."""
    c, record = work.config, work.record
    assert record is not None  # run_short raised for a job that left no result
    m = Measured(c, record["rows"], record["engine"], record["seconds"], not work.made,
                 ran_seconds=work.ran_seconds)
    m.knobs = {k: (change, work.knobs[k]["rows"]) for k, change in work.changes.items()}
    m.knob_seconds = sum(float(work.knobs[k].get("seconds", 0.0)) for k in work.changes)
    return m


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
