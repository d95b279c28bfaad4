"""``ablate publish``: copy a grid's recorded trials into another MLflow store.

A grid submitted against one store (the laptop's SQLite file) keeps its trials there; a
re-submit against another store (the team's server) runs nothing again, so that store would
show nothing. Publishing copies each finished trial from the workdir's records, which are the
truth (``metrics.jsonl`` every step, ``state.json`` the verdict, ``attempts.json`` the pools and
cost, ``spec.json`` the params), into a child run of the grid's experiment there, with the same
params and tags a submission gives it (``trial_params``, ``trial_tags``, ``attempt_tags``, the
verdict's tags), every step exactly once.

Idempotent: each published run carries ``ablate.published`` = a digest of the records it was
made from. Publishing again skips a trial whose digest is the same, and replaces a run whose
trial changed since (a resume: the new run is written first, the old one is then soft-deleted),
so the store always holds one run per trial with one value per step. A run of the trial that the
submission itself logged there is left alone. Unfinished trials are not published (their steps
may still be replaced); the report says so.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import UserError
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.store.summary import read_summary
from orchestrator.tracking._grid_run import GridRun, experiment_for
from orchestrator.tracking._labels import (
    MAX_METRICS,
    MAX_PARAMS_TAGS,
    THROUGH_TAG,
    _tags,
    attempt_tags,
    trial_params,
    trial_run_name,
    trial_tags,
)
from orchestrator.tracking._store import client, fail_fast, is_permanent, sanitize_key
from orchestrator.verdict import Verdict

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
    from orchestrator.trial import TrialSpec

PUBLISHED_TAG = "ablate.published"  # digest of the records the run was made from
SOURCE_TAG = "ablate.published_from"


@dataclasses.dataclass
class PublishReport:
    """What one ``publish`` did, by trial id."""

    store: str
    published: list[str] = dataclasses.field(default_factory=list)
    replaced: list[str] = dataclasses.field(default_factory=list)  # changed since, run replaced
    unchanged: list[str] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)  # logged there by a submission
    unfinished: list[str] = dataclasses.field(default_factory=list)
    damaged: list[str] = dataclasses.field(default_factory=list)  # one line each

    def describe(self, grid: str) -> str:
        n = len(self.published) + len(self.replaced)
        parts = [f"published {n} trial{'' if n == 1 else 's'} of grid {grid} to {self.store}"]
        if self.replaced:
            parts.append(f"{len(self.replaced)} of them replaced a run of an earlier publish")
        if self.unchanged:
            parts.append(f"{len(self.unchanged)} already there, unchanged")
        if self.present:
            parts.append(f"{len(self.present)} logged there by their submission")
        if self.unfinished:
            parts.append(f"{len(self.unfinished)} unfinished, not published (publish again "
                         "when they end)")
        return "; ".join(parts)


def publish(grid: GridSpec, *, tracking_uri: str, workdir: str | None = None) -> PublishReport:
    """Copy the finished trials of ``grid``'s workdir records into ``tracking_uri``."""
    grid_dir = workspace.grid_dir(grid.name, workdir)
    if not (grid_dir / "trials").is_dir():
        raise UserError(f"grid {grid.name} has no trials in {workspace.workdir(workdir)}; "
                        f"nothing to publish (run it with `ablate submit {grid.file}`)")
    report = PublishReport(workspace.display_uri(tracking_uri, workdir))
    todo = []
    for tid, spec in records.known_trials(grid_dir).items():
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        if not rec.state.is_finished():
            report.unfinished.append(tid)
            continue
        problem = records.check_metrics(paths.metrics, rec.last_step).describe()
        if problem:
            raise UserError(f"trial {tid}: {problem}; nothing published; fix: `ablate submit "
                            f"{grid.file}` first (it restores the steps)")
        todo.append((spec, paths, rec))
    mlc = client(tracking_uri)
    root = workspace.workdir(workdir)
    try:
        with fail_fast(tracking_uri, timeout_s=30):
            exp_id = experiment_for(mlc, grid.name, tracking_uri, root)
            runs = _trial_runs(mlc, exp_id)
    except Exception as exc:
        if is_permanent(exc):
            raise
        raise UserError(f"MLflow tracking store {report.store} is unreachable "
                        f"({type(exc).__name__}); nothing published; fix: start the server or "
                        "check --tracking-uri") from None
    parent: GridRun | None = None
    for spec, paths, rec in todo:
        digest = _digest(spec, paths)
        old = runs.get(spec.trial_id)
        if old is not None and old.data.tags.get(PUBLISHED_TAG) == digest:
            report.unchanged.append(spec.trial_id)
            continue
        if old is not None and PUBLISHED_TAG not in old.data.tags:
            report.present.append(spec.trial_id)  # the submission's own run: never replaced
            continue
        if parent is None:  # a parent run only when something is written
            parent = GridRun.open(grid, tracking_uri=tracking_uri, workdir=root)
            _set_tags(mlc, parent.run_id, {SOURCE_TAG: str(root), PUBLISHED_TAG: "grid"})
        with fail_fast(tracking_uri, timeout_s=60):
            _write_run(mlc, grid, exp_id, parent.run_id, spec, paths, rec, digest, str(root))
            if old is not None:
                mlc.set_tag(old.info.run_id, "superseded_by", "a newer publish of the trial")
                mlc.delete_run(old.info.run_id)
        (report.replaced if old is not None else report.published).append(spec.trial_id)
    if parent is not None:
        parent.publish_summaries(grid.name, grid_dir)
        parent.end("FINISHED")
    return report


def _trial_runs(mlc: Any, exp_id: str) -> dict[str, Any]:
    """The active trial runs of the experiment by trial id (newest first wins)."""
    out: dict[str, Any] = {}
    token = None
    while True:
        page = mlc.search_runs([exp_id], filter_string="tags.trial_id != ''", max_results=1000,
                               order_by=["attributes.start_time DESC"], page_token=token)
        for run in page:
            out.setdefault(run.data.tags.get("trial_id", ""), run)
        token = page.token
        if not token:
            return out


def _digest(spec: TrialSpec, paths: TrialPaths) -> str:
    """What a published run is made of: the trial's spec, state, attempts and every step."""
    h = hashlib.sha256()
    for path in (paths.spec, paths.state, paths.attempts, paths.metrics):
        h.update(path.name.encode())
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:24]


def _rows(paths: TrialPaths) -> list[tuple[int, dict[str, float]]]:
    """One row per step (the last written wins: the file is the truth)."""
    by_step = dict(records.iter_metrics(paths.metrics))
    return sorted(by_step.items())


def _write_run(mlc: Any, grid: GridSpec, exp_id: str, parent_id: str, spec: TrialSpec,
               paths: TrialPaths, rec: records.TrialRecord, digest: str, source: str) -> None:
    from mlflow.entities import Metric, Param

    attempts = records.load_attempts(paths)
    pool = grid.pools.pools.get(spec.pool)
    if pool is None:
        raise UserError(f"trial {spec.trial_id}: pool {spec.pool!r} is not in the grid's pool "
                        f"catalogue; fix: publish with the catalogue it ran with")
    started = min((a.started_at for a in attempts if a.started_at), default=time.time())
    ended = max((a.ended_at for a in attempts if a.ended_at), default=started)
    tags = trial_tags(spec, pool, parent_id)
    tags.update(attempt_tags(attempts, spec.steps, pool))
    if rec.verdict:
        tags.update(Verdict.from_json(rec.verdict).tags())
    done = read_summary(paths) if rec.state.is_finished() else None
    if done is not None:  # as the runner tags its run: a compare elsewhere reads the exact scalars
        tags.update(done.tags())
    rows = _rows(paths)
    last = rows[-1][0] if rows else 0
    tags.update({PUBLISHED_TAG: digest, SOURCE_TAG: source, THROUGH_TAG: str(last)})
    run = mlc.create_run(exp_id, run_name=trial_run_name(spec), start_time=int(started * 1000),
                         tags={k: str(v) for k, v in tags.items()})
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in trial_params(spec).items()]
    for chunk in _chunks(params, MAX_PARAMS_TAGS):
        mlc.log_batch(run_id, params=list(chunk))
    # One value per step; a step's timestamp grows with the step (compare keeps the newest).
    base_ms = int(started * 1000)
    flat = [Metric(sanitize_key(k), v, base_ms + step, step) for step, row in rows
            for k, v in row.items()]
    for chunk in _chunks(flat, MAX_METRICS):
        mlc.log_batch(run_id, metrics=list(chunk))
    status = "FINISHED" if rec.state.value == "done" else "FAILED" if rec.state.value == "failed" else "KILLED"
    mlc.set_terminated(run_id, status, end_time=int(ended * 1000))


def _set_tags(mlc: Any, run_id: str, tags: dict[str, str]) -> None:
    mlc.log_batch(run_id, tags=_tags(tags))


def _chunks(items: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def recorded_elsewhere(grid_name: str, tracking_uri: str, trial_ids: Sequence[str]) -> int:
    """How many of ``trial_ids`` have no run in the grid's experiment of ``tracking_uri``
    (0 when the store cannot be asked: the submission reports an unreachable store itself)."""
    if not trial_ids:
        return 0
    mlc = client(tracking_uri)
    try:
        with fail_fast(tracking_uri, timeout_s=15):
            exp = mlc.get_experiment_by_name(grid_name)
            have = set() if exp is None else set(_trial_runs(mlc, exp.experiment_id))
    except Exception:  # noqa: BLE001 - only a hint; the submission checks the store itself
        return 0
    return sum(1 for t in trial_ids if t not in have)
