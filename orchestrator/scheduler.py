"""Ray Tune control plane: ``ablate submit``, ``ablate status``, ``ablate cancel``.

One Tune trial per grid trial, placed on its pool by a Ray resource (``pool:<name>`` in the
embedded cluster, ``accelerator_type:<X>`` or the ``ray.io/accelerator-type`` node label on an
existing one): hardware is pinned, never substituted. Concurrency limits and the queue live in
``gate.PoolGate``; one attempt of a trial is ``runner.run_attempt``; infra failures are retried by
Tune's ``FailureConfig`` and resume from the trial's own checkpoint store.

Crash safety does not rest on Tune's experiment restore: ``Tuner.restore`` keeps the old
resources (#15570), can break ``max_concurrent_trials`` (#40652) and cannot take a changed
search space (adding axis values). The trial records are the truth instead: a re-submit expands
the grid again (content-hashed ids), skips finished trials, and every unfinished one resumes
from its latest verified checkpoint; the grid lease and per-trial locks keep it single-run.
"""
from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import records, workspace
from orchestrator.exceptions import UserError
from orchestrator.lease import GridLease
from orchestrator.pools import PoolSpec
from orchestrator.runner import AttemptJob, TrackingTarget, run_attempt
from orchestrator.schema import CheckpointSpec, CollapseSpec, EarlyStopSpec, SearchObjective
from orchestrator.trial import TrialPaths, TrialSpec, TrialState, atomic_write_json, transition

LABEL_ACCELERATOR = "ray.io/accelerator-type"


# --------------------------------------------------------------------------- placement


@dataclasses.dataclass(frozen=True)
class Placement:
    """How trials of one pool are placed, and how many the cluster can run at once."""

    pool: str
    resources: Mapping[str, float]
    label_selector: Mapping[str, str] | None
    capacity: int
    reason: str | None = None  # why the pool cannot run anything here (capacity 0)


def plan_placement(pools: Mapping[str, PoolSpec], *, embedded: bool,
                   cluster_resources: Mapping[str, float],
                   node_labels: list[Mapping[str, str]], cpus: float = 1.0) -> dict[str, Placement]:
    """Map each pool to Ray resources; pools nothing can host get a capacity of 0 and a reason."""
    out: dict[str, Placement] = {}
    for name, pool in pools.items():
        res_key = pool.ray_resource
        base = {"CPU": cpus}
        if embedded and pool.kind == "gpu":
            out[name] = Placement(name, base, None, 0,
                                  f"pool {name} is a GPU pool; the embedded local Ray has no GPUs: "
                                  f"pass --address of a cluster that has it")
        elif res_key in cluster_resources or embedded:
            cap = int(cluster_resources.get(res_key, pool.capacity) + 1e-9)
            reason = None if cap > 0 else f"pool {name} has capacity 0 (Ray resource {res_key})"
            out[name] = Placement(name, {**base, res_key: 1.0}, None, cap, reason)
        elif pool.ray_accelerator_type and f"accelerator_type:{pool.ray_accelerator_type}" in cluster_resources:
            out[name] = Placement(name, {**base, f"accelerator_type:{pool.ray_accelerator_type}": 0.001},
                                  None, pool.capacity)
        elif pool.ray_accelerator_type and any(
                lab.get(LABEL_ACCELERATOR) == pool.ray_accelerator_type for lab in node_labels):
            out[name] = Placement(name, base, {LABEL_ACCELERATOR: pool.ray_accelerator_type},
                                  pool.capacity)
        else:
            acc = pool.ray_accelerator_type
            out[name] = Placement(name, base, None, 0,
                                  f"no node of the Ray cluster advertises {res_key}"
                                  + (f", accelerator_type:{acc} or label {LABEL_ACCELERATOR}={acc}"
                                     if acc else "") + "; add such nodes or pick another pool")
    return out


def _resource_fn(placements: Mapping[str, Placement]) -> Any:
    from ray.tune import PlacementGroupFactory

    def resources(config: Mapping[str, Any]) -> Any:
        p = placements[config["pool"]]
        if p.label_selector:
            return PlacementGroupFactory([dict(p.resources)], bundle_label_selector=[dict(p.label_selector)])
        return PlacementGroupFactory([dict(p.resources)])

    return resources


# --------------------------------------------------------------------------- the Tune trainable


@dataclasses.dataclass(frozen=True)
class GridContext:
    """What every Tune trial of a submission shares (shipped once through the object store)."""

    grid_dir: str
    recipe_config: Mapping[str, Any]
    pools: Mapping[str, PoolSpec]
    checkpoint: CheckpointSpec
    collapse: CollapseSpec
    early_stop: EarlyStopSpec
    tracking: TrackingTarget | None
    submission: str
    backend_refs: Mapping[str, tuple[str, str]]
    objective: SearchObjective | None


def objective_value(result: Mapping[str, Any], objective: SearchObjective | None) -> float | None:
    """The search objective of a finished trial: the metric, penalised for collapse/NaN."""
    if objective is None:
        return None
    summary = result.get("summary") or {}
    value = records.finite_or_none(summary.get(objective.metric))
    if value is None and objective.metric.endswith("/final"):
        value = records.finite_or_none(summary.get(objective.metric[: -len("/final")]))
    kind = (result.get("verdict") or {}).get("kind")
    sign = -1.0 if objective.mode == "max" else 1.0
    if kind in ("collapsed", "numeric_failure") or value is None:
        return (value or 0.0) + sign * float(objective.collapse_penalty)
    return value


def _trainable(config: dict[str, Any], gctx: GridContext) -> None:
    from ray import tune

    from orchestrator.recipes import apply_overrides

    trial = TrialSpec.from_json(config["trial"])
    job = AttemptJob(grid_dir=gctx.grid_dir, trial=trial,
                     config=apply_overrides(gctx.recipe_config, trial.override_map),
                     pool=gctx.pools[config["pool"]], checkpoint=gctx.checkpoint, collapse=gctx.collapse,
                     early_stop=gctx.early_stop, tracking=gctx.tracking, submission=gctx.submission,
                     backend_ref=gctx.backend_refs[trial.backend])
    result = run_attempt(job)
    report = {"trial_id": trial.trial_id, "state": result.get("state"),
              "last_step": result.get("last_step"), "node": result.get("node"),
              "verdict": (result.get("verdict") or {}).get("kind")}
    obj = objective_value(result, gctx.objective)
    if obj is not None:
        report["objective"] = obj
    tune.report(report)


# --------------------------------------------------------------------------- submit


def _connect(address: str | None, pools: Mapping[str, PoolSpec], ray_tmp: str | None) -> tuple[bool, bool]:
    """Connect to Ray: (we started an embedded local cluster, we own the connection).

    A caller that already initialised Ray (a notebook, a benchmark) keeps its connection.
    """
    import ray

    addr = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return False, False
    if addr:
        ray.init(address=addr, log_to_driver=False, configure_logging=False)
        return False, True
    capacity = {p.ray_resource: float(p.capacity) for p in pools.values() if p.kind == "sim"}
    ray.init(num_cpus=max(os.cpu_count() or 1, int(sum(capacity.values()))), resources=capacity,
             include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=ray_tmp)
    return True, True


def _prepare_records(grid_dir: Path, trials: list[TrialSpec],
                     tracking_uri: str) -> tuple[list[TrialSpec], int]:
    """Write spec/state for new trials; reset trials left RUNNING by a dead orchestrator;
    send what finished trials still owe MLflow (their outbox, if the store was down)."""
    todo, finished = [], 0
    for t in trials:
        paths = TrialPaths(grid_dir, t.trial_id)
        records.save_spec(paths, t)
        rec = records.load_state(paths, t.trial_id)
        if rec.state.is_finished():
            finished += 1
            _drain_outbox(paths, tracking_uri)
            continue
        if rec.state is TrialState.RUNNING or not paths.state.exists() or rec.pending_reason:
            if rec.state is TrialState.RUNNING:  # its orchestrator died; the runner resumes it
                rec.state = transition(rec.state, TrialState.PENDING)
            rec.pending_reason = None
            rec.pool = rec.pool or t.pool
            records.save_state(paths, rec)
        todo.append(t)
    return todo, finished


def _live_callback(key: int) -> Any:
    """A Tune callback that ticks the live view ``key``. Tune pickles its callbacks with the
    experiment, so the callback holds only the key, never the rich Live object (it has locks)."""
    from ray.tune import Callback

    class LiveCallback(Callback):
        def __init__(self, key: int) -> None:
            self.key = key

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            from orchestrator import progress  # by reference: never pickle the views

            view = progress.LIVE_VIEWS.get(self.key)
            if view is not None:
                view.tick()

    return LiveCallback(key)


def _drain_outbox(paths: TrialPaths, tracking_uri: str) -> None:
    buffer_dir = paths.root / "mlflow-buffer"
    if not buffer_dir.is_dir():
        return
    from orchestrator.tracking_buffer import Outbox

    if not Outbox(buffer_dir).empty():
        from orchestrator.tracking import drain

        drain(buffer_dir, tracking_uri, timeout=10)


class _Live:
    """Refreshes queue.json and the rich live table about once a second (from Tune's loop)."""

    def __init__(self, grid_dir: Path, grid_name: str, gate: Any, show: bool) -> None:
        self.grid_dir, self.grid_name, self.gate = grid_dir, grid_name, gate
        self._last = 0.0
        self.live: Any = None
        from orchestrator import progress

        progress.LIVE_VIEWS[id(self)] = self
        self.callback = _live_callback(id(self))
        if show:
            from rich.live import Live

            from orchestrator import progress

            self.live = Live(progress.render(progress.collect(grid_dir, grid_name)),
                             refresh_per_second=2, transient=False)
            self.live.start()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        atomic_write_json(self.grid_dir / "queue.json", {"reasons": self.gate.reasons(),
                                                         "updated_at": time.time()})
        if self.live is not None:
            from orchestrator import progress

            self.live.update(progress.render(progress.collect(self.grid_dir, self.grid_name)))

    def stop(self) -> None:
        self.tick(force=True)
        from orchestrator import progress

        progress.LIVE_VIEWS.pop(id(self), None)
        if self.live is not None:
            self.live.stop()


def submit(grid_path: str, *, backend: str | None = None, address: str | None = None,
           tracking_uri: str | None = None, workdir: str | None = None,
           max_parallel: int | None = None, force: bool = False, progress: bool = True,
           ray_tmp: str | None = None) -> dict[str, Any]:
    """Run a grid (or its search) to the end on Ray Tune; resumes whatever an earlier run left.

    Returns a JSON-safe summary. Raises ``ConcurrencyError`` if the grid runs elsewhere, and
    ``UserError`` for a bad grid, both before anything starts.
    """
    from orchestrator.grid import expand, load_grid

    grid = load_grid(grid_path, backend=backend)
    trials = [] if grid.spec.search is not None else expand(grid, force=force)
    if max_parallel is not None and max_parallel < 1:
        raise UserError(f"--max-parallel {max_parallel}: must be >= 1")
    grid_dir = workspace.grid_dir(grid.name, workdir)
    submission = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    lease = GridLease(grid_dir, grid.name)
    lease.acquire(submission)
    try:
        return _run(grid, trials, grid_dir, submission, address=address,
                    tracking_uri=workspace.tracking_uri(tracking_uri, workdir),
                    root=workspace.workdir(workdir), max_parallel=max_parallel or
                    grid.spec.budget.max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=True)
    finally:
        lease.release()


def run_trials(grid: Any, trials: list[TrialSpec], *, submission: str, address: str | None = None,
               tracking_uri: str | None = None, workdir: str | None = None,
               max_parallel: int | None = None, progress: bool = True,
               ray_tmp: str | None = None) -> dict[str, Any]:
    """Run exactly ``trials`` of ``grid`` on Ray Tune (``ablate resume``, derived trials
    included); the caller holds the grid lease. No automatic rescue round."""
    return _run(grid, list(trials), workspace.grid_dir(grid.name, workdir), submission,
                address=address, tracking_uri=workspace.tracking_uri(tracking_uri, workdir),
                root=workspace.workdir(workdir), max_parallel=max_parallel or
                grid.spec.budget.max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=False)


def _run(grid: Any, trials: list[TrialSpec], grid_dir: Path, submission: str, *,
         address: str | None, tracking_uri: str, root: Path, max_parallel: int, progress: bool,
         ray_tmp: str | None, rescue: bool) -> dict[str, Any]:
    # Tune's own console output would fight the rich live table; our view replaces it.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    from orchestrator.backends import _REGISTRY
    from orchestrator.gate import PoolGate, SearchSpace
    from orchestrator.tracking import GridRun

    started = time.time()
    atomic_write_json(grid_dir / "grid.json", {"name": grid.name, "file": str(Path(grid.file).resolve()),
                                               "submission": submission, "submitted_at": started,
                                               "host": socket.gethostname()})
    atomic_write_json(grid_dir / "recipe.json", {"recipe": grid.spec.recipe,
                                                 "config": dict(grid.recipe_config)})
    search = SearchSpace(grid) if grid.spec.search is not None else None
    prior: list[tuple[dict[str, Any], float | None]] = []
    if search is not None:
        trials, prior = _search_records(grid_dir)
    records.clear_cancel_requests(grid_dir, ["*"])  # a new submission means: run it
    todo, already = _prepare_records(grid_dir, trials, tracking_uri)
    already += len(prior)  # search points finished by earlier submissions
    trial_pool = {t.trial_id: t.pool for t in todo}
    routes = {t.trial_id: records.route_pool(records.load_state(TrialPaths(grid_dir, t.trial_id),
                                                                t.trial_id), t) for t in todo}
    pool_specs = {p: grid.pools.get(p) for p in set(routes.values()) | set(grid.spec.budget.per_pool)}
    on_collapse = grid.spec.on_collapse if rescue and search is None else None
    if on_collapse is not None and on_collapse.resume.pool:
        # Known before Ray starts: the embedded cluster only has resources for these pools.
        pool_specs[on_collapse.resume.pool] = grid.pools.get(on_collapse.resume.pool)
    if search is not None:
        pool_specs.update({lab: grid.pools.get(lab) for a in grid.axes if a.kind == "pool" for lab in a.labels})
        if grid.spec.pool:
            pool_specs[grid.spec.pool] = grid.pools.get(grid.spec.pool)
    embedded, owned = _connect(address, pool_specs, ray_tmp)
    parent = None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        placements = plan_placement(pool_specs, embedded=embedded,
                                    cluster_resources=ray.cluster_resources(),
                                    node_labels=[n.get("Labels") or {} for n in nodes])
        runnable = _park_unplaceable(grid_dir, todo, placements, routes)
        limits = {p: min(pl.capacity, grid.spec.budget.per_pool.get(p, pl.capacity))
                  for p, pl in placements.items()}
        parent = GridRun.open(grid, tracking_uri=tracking_uri, workdir=root)
        tracking = TrackingTarget(tracking_uri, parent.experiment_id, parent.run_id)
        objective = grid.spec.search.objective if search is not None else None
        gctx = GridContext(str(grid_dir), dict(grid.recipe_config), pool_specs, grid.spec.checkpoint,
                           grid.spec.collapse, grid.spec.early_stop_spec, tracking, submission,
                           {grid.backend: _REGISTRY[grid.backend]}, objective)
        budget = 0
        if search is not None:
            budget = max(grid.spec.search.budget - len(prior) - len(runnable), 0)

        def remember(trial: TrialSpec, stored: dict[str, Any]) -> None:
            paths = TrialPaths(grid_dir, trial.trial_id)
            records.save_spec(paths, trial)
            rec = records.load_state(paths, trial.trial_id)
            rec.search, rec.pool = stored, trial.pool
            records.save_state(paths, rec)

        def fit(runnable: list[TrialSpec], routes: Mapping[str, str], budget: int, name: str) -> Any:
            gate = PoolGate(grid_dir, runnable, limits, max_parallel, search=search, search_budget=budget,
                            on_new_trial=remember,
                            routes={t: p for t, p in routes.items() if p != trial_pool.get(t)})
            for stored, value in prior:
                gate.tell_previous(stored, value)
            live = _Live(grid_dir, grid.name, gate, progress)
            try:
                tuner = tune.Tuner(
                    tune.with_resources(tune.with_parameters(_trainable, gctx=gctx), _resource_fn(placements)),
                    tune_config=tune.TuneConfig(search_alg=gate, num_samples=-1, reuse_actors=True),
                    run_config=tune.RunConfig(
                        name=name, storage_path=str(grid_dir / "tune"), verbose=0,
                        failure_config=tune.FailureConfig(max_failures=grid.spec.retries.max),
                        callbacks=[live.callback]),
                )
                tuner.fit()
            finally:
                live.stop()
            _mark_exhausted(grid_dir, gate.errors, tracking_uri)
            return gate

        gate = fit(runnable, routes, budget, submission)
        if search is not None:
            _store_objectives(grid_dir, gate.results)
        rescued: list[TrialSpec] = []
        if on_collapse is not None:
            # `on_collapse: {resume: ...}`: one automatic rescue round, under this lease.
            from orchestrator.resume import auto_rescue

            rescued = auto_rescue(grid, grid_dir, [t.trial_id for t in trials])
            if rescued:
                again = {t.trial_id: records.route_pool(records.load_state(
                    TrialPaths(grid_dir, t.trial_id), t.trial_id), t) for t in rescued}
                fit(_park_unplaceable(grid_dir, rescued, placements, again), again, 0,
                    submission + "-rescue")
        summary = summarize(grid, grid_dir, trials_of(grid_dir, search is not None, trials))
        summary["rescued"] = [t.trial_id for t in rescued]
        summary.update(submission=submission, elapsed_s=round(time.time() - started, 2),
                       skipped_finished=already, tune_dir=str(grid_dir / "tune" / submission),
                       tracking_uri=tracking_uri, parent_run_id=parent.run_id,
                       ray="embedded" if embedded else "cluster")
        parent.end("FINISHED")
        parent = None
        return summary
    finally:
        if parent is not None:
            parent.end("FAILED")
        if owned:
            ray.shutdown()


def _park_unplaceable(grid_dir: Path, todo: list[TrialSpec], placements: Mapping[str, Placement],
                      routes: Mapping[str, str]) -> list[TrialSpec]:
    """Trials whose pool has no capacity stay PENDING with the reason, instead of hanging Tune."""
    runnable = []
    for t in todo:
        reason = placements[routes.get(t.trial_id, t.pool)].reason
        if reason is None:
            runnable.append(t)
            continue
        paths = TrialPaths(grid_dir, t.trial_id)
        rec = records.load_state(paths, t.trial_id)
        rec.pending_reason = "not started: " + reason
        records.save_state(paths, rec)
    return runnable


def _mark_exhausted(grid_dir: Path, trial_ids: set[str], tracking_uri: str) -> None:
    """Trials Tune gave up on (retries.max infra failures) end FAILED with their last error,
    on disk and in MLflow (their runs would otherwise stay RUNNING there)."""
    import logging

    for tid in trial_ids:
        paths = TrialPaths(grid_dir, tid)
        rec = records.load_state(paths, tid)
        if rec.state.is_finished():
            continue
        attempts = records.load_attempts(paths)
        reason = (attempts[-1].reason if attempts else None) or rec.error or "infra failure"
        rec.state = transition(rec.state, TrialState.FAILED)
        rec.error = f"retries exhausted after {len(attempts)} attempts: {reason}"
        rec.verdict = {"kind": "infra_failure", "step": rec.last_step, "reason": rec.error}
        records.save_state(paths, rec)
        if rec.mlflow_run_id:
            try:
                from orchestrator.tracking import client

                mlc = client(tracking_uri)
                for key, value in (("verdict", "infra_failure"), ("verdict.reason", rec.error[:4000]),
                                   ("verdict.step", str(rec.last_step))):
                    mlc.set_tag(rec.mlflow_run_id, key, value)
                mlc.set_terminated(rec.mlflow_run_id, "FAILED")
            except Exception as exc:  # noqa: BLE001 - the record on disk is what counts
                logging.getLogger(__name__).warning("trial %s: MLflow not updated: %s", tid, exc)


def _search_records(grid_dir: Path) -> tuple[list[TrialSpec], list[tuple[dict[str, Any], float | None]]]:
    """Search trials of earlier submissions: unfinished ones to resume, finished ones to teach."""
    unfinished, done = [], []
    for spec_path in sorted((grid_dir / "trials").glob("*/spec.json")):
        paths = TrialPaths(grid_dir, spec_path.parent.name)
        rec = records.load_state(paths, spec_path.parent.name)
        spec = records.load_spec(paths)
        if rec.search is None or spec is None:
            continue
        if rec.state.is_finished():
            done.append((rec.search, rec.objective))
        else:
            unfinished.append(spec)
    return unfinished, done


def _store_objectives(grid_dir: Path, results: Mapping[str, Mapping[str, Any]]) -> None:
    for tid, res in results.items():
        if "objective" in res:
            paths = TrialPaths(grid_dir, tid)
            rec = records.load_state(paths, tid)
            rec.objective = float(res["objective"])
            records.save_state(paths, rec)


def trials_of(grid_dir: Path, search: bool, trials: list[TrialSpec]) -> list[str]:
    if not search:
        return [t.trial_id for t in trials]
    return [p.parent.name for p in sorted((grid_dir / "trials").glob("*/spec.json"))
            if records.load_state(TrialPaths(grid_dir, p.parent.name), p.parent.name).search]


def summarize(grid: Any, grid_dir: Path, trial_ids: list[str]) -> dict[str, Any]:
    """Counts by state and verdict, the pending trials with reasons, the search's best point."""
    states: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    pending, failed, best = [], [], None
    for tid in trial_ids:
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        states[rec.state.value] = states.get(rec.state.value, 0) + 1
        if rec.verdict:
            verdicts[rec.verdict["kind"]] = verdicts.get(rec.verdict["kind"], 0) + 1
        if not rec.state.is_finished():
            pending.append({"trial_id": tid, "pool": rec.pool, "reason": rec.pending_reason or rec.error})
        if rec.state is TrialState.FAILED:
            failed.append({"trial_id": tid, "reason": rec.error})
        if rec.search is not None and rec.objective is not None and math.isfinite(rec.objective):
            mode = grid.spec.search.objective.mode
            if best is None or (rec.objective > best["objective"]) == (mode == "max"):
                best = {"trial_id": tid, "objective": rec.objective, **rec.search}
    out = {"grid": grid.name, "trials": len(trial_ids), "states": states, "verdicts": verdicts,
           "pending": pending, "failed": failed, "grid_dir": str(grid_dir)}
    if grid.spec.search is not None:
        out["search"] = {"budget": grid.spec.search.budget, "best": best}
    return out


# `ablate status` and `ablate cancel` live in control.py; commands.py calls them through here.
from orchestrator.control import cancel, status_command

__all__ = ["Placement", "cancel", "objective_value", "plan_placement", "status_command", "submit"]
