"""Submitting a grid's trials to Ray Tune: ``ablate submit`` (``submit``) and the runs ``ablate
resume`` starts (``run_trials``), each one ``Submission``.

One Tune trial per grid trial, placed on its pool by a Ray resource (``pool:<name>`` in the
embedded cluster, ``accelerator_type:<X>`` or the ``ray.io/accelerator-type`` node label on an
existing one, ``_placement``): hardware is pinned, never substituted. Concurrency limits and the
queue live in ``_gate.PoolGate``; what a Ray worker runs is ``_trainable`` (one attempt through
``orchestrator.run``); infra failures are retried by Tune's ``FailureConfig`` and resume from the
trial's own checkpoint store.

Crash safety does not rest on Tune's experiment restore: ``Tuner.restore`` keeps the old
resources (#15570), can break ``max_concurrent_trials`` (#40652) and cannot take a changed
search space (adding axis values). The trial records are the truth instead: a re-submit expands
the grid again (content-hashed ids), skips finished trials, and every unfinished one resumes
from its latest verified checkpoint; the grid lease and per-trial locks keep it single-run.

Keeping a slot busy: Tune runs trials in reused worker processes (``reuse_actors``); MLflow
writes of an attempt happen in this process (``tracking.Sender``), not in the slot, and so does
opening the parent run, beside Ray's start-up; see ``_tune.tune_env``, ``_trainable._warm_up`` and
the gate's standby trial for the three ways Tune would otherwise leave a slot idle between
short trials.

ray is imported by the functions that use it: ``ablate status`` and ``ablate plan`` import this
module without starting anything.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import backends
from orchestrator.cost import total_metrics
from orchestrator.exceptions import UserError
from orchestrator.grid import check_notify, expand, load_grid, preflight_gates
from orchestrator.pools import PoolSpec
from orchestrator.scheduler._bookkeeping import (
    mark_exhausted,
    park,
    park_unplaceable,
    preflight_skips,
    prepare_records,
    remember_point,
)
from orchestrator.scheduler._budget import Planner, cost_run_tags, grid_cost
from orchestrator.scheduler._events import SUMMARY_EVERY_S, EventWatcher, Sink
from orchestrator.scheduler._faults import fault_error, stop_on_full_disk
from orchestrator.scheduler._identity import check_identity, renamed, store_note
from orchestrator.scheduler._lineage import rescue_links, rescue_trials
from orchestrator.scheduler._notify import Notifier
from orchestrator.scheduler._placement import (
    Placement,
    check_address,
    connect,
    plan_placement,
    standby_slots,
)
from orchestrator.scheduler._progress import LiveView, say_interrupted, summarize, trials_of
from orchestrator.scheduler._repair import repair_trial
from orchestrator.scheduler._reports import SubmitReport
from orchestrator.scheduler._rescue import Rescuer
from orchestrator.scheduler._search import SearchSpace, search_records, store_objectives
from orchestrator.scheduler._trainable import GridContext
from orchestrator.scheduler._tune import (
    drop_tune_pickles,
    stop_credential_propagation,
    tune_env,
    tuner,
)
from orchestrator.store import GridLease, TrialPaths, atomic_write_json, records, workspace
from orchestrator.tracking import Sender, check_store, is_remote
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

log = logging.getLogger(__name__)

def submit(grid_path: str, *, backend: str | None = None, address: str | None = None,
           tracking_uri: str | None = None, workdir: str | None = None,
           max_parallel: int | None = None, force: bool = False, progress: bool = True,
           ray_tmp: str | None = None, events: Sink | None = None,
           summary_every_s: float = SUMMARY_EVERY_S, name: str | None = None,
           extend: bool = False) -> SubmitReport:
    """Run a grid (or its search) to the end on Ray Tune; resumes whatever an earlier run left.
    ``events`` receives each trial event and, every ``summary_every_s``, the counts per pool
    (``_events``; what ``ablate submit`` prints off a terminal). ``name`` runs it under another
    name; ``extend`` adds its trials to an existing grid of that name that has other trials
    (``_identity``).

    Returns a ``SubmitReport`` (as a mapping, the JSON-safe summary). Raises ``ConcurrencyError`` if the grid runs elsewhere, and
    ``UserError`` for a bad grid, both before anything starts.
    """
    grid = renamed(load_grid(grid_path, backend=backend, limit_trials=not force), name)
    trials = expand(grid, force=force)  # a search grid too: the checks of its plan, up front
    if grid.spec.search is not None:
        trials = []  # its trials are the points the search samples
    check_notify(grid)
    preflight_gates(grid)
    if max_parallel is not None and max_parallel < 1:
        raise UserError(f"--max-parallel {max_parallel}: must be >= 1")
    if not math.isfinite(summary_every_s) or summary_every_s <= 0:
        raise UserError(f"--summary-every {summary_every_s}: must be a finite number of seconds > 0")
    workspace.check_workdir(workdir)  # a bad workdir, store or cluster: one line, before anything starts
    check_store(workspace.tracking_uri(tracking_uri, workdir))
    check_address(address)
    # Before anything is written (the grid's directory, its lease).
    backends.backend(grid.backend).require(_pools_used(grid, trials), where=f"{grid.file}: pool")
    grid_dir = workspace.grid_dir(grid.name, workdir)
    submission = submission_id()
    lease = GridLease(grid_dir, grid.name)
    with stop_on_full_disk(grid_dir, trials, grid.spec.checkpoint):
        lease.acquire(submission)
        try:
            note = check_identity(grid, grid_dir, trials, extend=extend)
            if note is not None:
                print(note, file=sys.stderr, flush=True)
            uri = workspace.tracking_uri(tracking_uri, workdir)
            note = store_note(grid, grid_dir, trials, uri)
            if note is not None:
                print(note, file=sys.stderr, flush=True)
            skipped = preflight_skips(grid, grid_dir, workdir=workdir, tracking_uri=tracking_uri)
            return SubmitReport(Submission(
                grid, trials, submission, tracking_uri=tracking_uri, workdir=workdir,
                max_parallel=max_parallel, progress=progress, ray_tmp=ray_tmp, rescue=True,
                events=events, summary_every_s=summary_every_s, skipped=skipped).run(address))
        finally:
            lease.release()


def _pools_used(grid: GridSpec, trials: list[TrialSpec]) -> list[PoolSpec]:
    """The pools the trials (or, for a search, the grid's pool setting) run on."""
    names = {t.pool for t in trials}
    if not trials:
        names = {grid.spec.pool} if grid.spec.pool else set(
            next((a.labels for a in grid.axes if a.kind == "pool"), ()))
    return [grid.pools.get(n) for n in sorted(names)]


def run_trials(grid: GridSpec, trials: list[TrialSpec], *, submission: str,
               address: str | None = None, tracking_uri: str | None = None,
               workdir: str | None = None, max_parallel: int | None = None,
               progress: bool = True, ray_tmp: str | None = None,
               events: Sink | None = None) -> dict[str, Any]:
    """Run exactly ``trials`` of ``grid`` on Ray Tune (``ablate resume``, derived trials
    included); the caller holds the grid lease. No automatic rescue round."""
    return Submission(grid, list(trials), submission, tracking_uri=tracking_uri, workdir=workdir,
                      max_parallel=max_parallel, progress=progress, ray_tmp=ray_tmp,
                      rescue=False, events=events).run(address)


def submission_id(kind: str | None = None) -> str:
    """A new submission's id (what the lease holds and attempts record): its start time, the
    ``kind`` of submission if not a plain submit (``resume``), and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + (f"{kind}-" if kind else "") + uuid.uuid4().hex[:6]


class Submission:
    """One submission of a grid's trials to Ray Tune, stage by stage; the caller holds the lease.

    ``run`` starts the MLflow sender beside everything else, then: ``_record`` (the grid's files
    of this submission), ``_prepare`` (the trial records), ``_pools`` (every pool it may run on),
    connect to Ray, ``_place`` (pools as Ray resources; trials of a pool without capacity stay
    pending with the reason), ``_fit`` (one Tune fit through the gate), ``_rescue`` (the grid's
    policy: rescues queued in the fit as trials end, then rounds of what is left) and
    ``_summary``.
    """

    def __init__(self, grid: GridSpec, trials: list[TrialSpec], submission: str, *,
                 tracking_uri: str | None, workdir: str | None, max_parallel: int | None,
                 progress: bool, ray_tmp: str | None, rescue: bool, events: Sink | None = None,
                 summary_every_s: float = SUMMARY_EVERY_S,
                 skipped: Mapping[str, str] | None = None) -> None:
        self.grid, self.trials, self.submission = grid, trials, submission
        self.skipped = dict(skipped or {})  # trial id -> why a preflight gate skips it
        self.grid_dir = workspace.grid_dir(grid.name, workdir)
        self.events = (EventWatcher(self.grid_dir, grid.name, events, summary_every_s=summary_every_s)
                       if events is not None else None)
        self.tracking_uri = workspace.tracking_uri(tracking_uri, workdir)
        self.max_parallel = max_parallel or grid.spec.budget.max_parallel
        self.progress, self.ray_tmp = progress, ray_tmp
        self.search = SearchSpace(grid) if grid.spec.search is not None else None
        self.policy = grid.spec.rescue_policy if rescue and self.search is None else ()
        self.owns_rescues = rescue and self.search is None  # a submit: its trials' rescues too
        self.remote_store = is_remote(self.tracking_uri)
        # MLflow (the parent run, then trials' outboxes) works beside Ray and Tune (``run``).
        self.sender = Sender(grid, self.grid_dir, self.tracking_uri, workspace.workdir(workdir))
        self.notifier = Notifier(grid, self.grid_dir)  # the grid's `notify:` webhooks (none: idle)
        # Budgets and adaptive seeds (``_budget``); it knows every seed a cell may get.
        self.planner = Planner(grid, self.grid_dir, trials, grid.pools.pools, add_seeds=rescue)
        self.started = 0.0
        # Filled by the stages, in order.
        self.prior: list[tuple[dict[str, Any], float | None]] = []  # search points run before
        self.already = 0  # trials (and search points) finished by earlier submissions
        self.rescues: list[TrialSpec] = []  # trials derived from the planned ones, on disk
        self.todo: list[TrialSpec] = []  # trials to run
        self.trial_pool: dict[str, str] = {}  # trial id -> its own pool
        self.routes: dict[str, str] = {}  # trial id -> the pool its next attempt runs on
        self.placements: dict[str, Placement] = {}
        self.limits: dict[str, int] = {}  # pool -> trials it runs at once
        self.standby: dict[str, int] = {}  # pool -> trials staged beyond its limit (_gate)
        self.repaired: list[str] = []  # damaged metrics files repaired before the run
        self.rescuer: Rescuer | None = None  # the rescue policy at work, once pools are placed

    def run(self, address: str | None) -> dict[str, Any]:
        """Run the trials to the end on Ray (``address``, or an embedded cluster); the summary."""
        # Tune's own console output would fight the rich live table; our view replaces it.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        self.started = time.time()
        self.sender.start()
        self.notifier.start()
        ok = False
        with stop_on_full_disk(self.grid_dir, self.trials, self.grid.spec.checkpoint):
            try:
                summary = self._stages(address)
                ok = True
                return summary
            except KeyboardInterrupt:
                self._say_interrupted()
                raise
            finally:
                self.notifier.close()
                self.sender.close()
                if not ok and self.sender.parent is not None:
                    try:
                        self.sender.parent.end("FAILED")
                    except Exception as exc:  # noqa: BLE001 - the store may be what failed
                        log.warning("parent run not closed: %s", exc)

    def _reported(self) -> tuple[list[str], list[str]]:
        """The trials a summary reports on: the submission's own (``trials_of``), and the
        trials derived from them (rescues), which are the grid's too."""
        search = self.search is not None
        trials = trials_of(self.grid_dir, search, self.trials + self.planner.added)
        return trials, [] if search else [t.trial_id for t in rescue_trials(self.grid_dir, trials)]

    def _say_interrupted(self) -> None:
        """Ctrl-C: what the submission's trials got to, on stderr (the CLI then exits 130)."""
        say_interrupted(self.grid, self.grid_dir, self._reported, self.started, self.already)

    def _stages(self, address: str | None) -> dict[str, Any]:
        import ray  # deferred, like every ray import here: `ablate status` imports this module

        self._record()
        self._prepare()
        pools = self._pools()
        worker_env = backends.backend(self.grid.backend).worker_env(self.grid.base_config)
        embedded, owned = connect(address, pools, self.ray_tmp, worker_env,
                                  elsewhere=backends.backend(self.grid.backend).computes_elsewhere)
        try:
            runnable = self._place(pools, embedded)
            if self.policy:
                self.rescuer = Rescuer(self.grid, self.grid_dir, self.planner, self.placements,
                                       self._routes)
            gctx = self._context(pools)
            budget = 0
            if self.search is not None:
                budget = max(self.grid.spec.search.budget - len(self.prior) - len(runnable), 0)
            gate = self._fit(gctx, runnable, self.routes, budget, self.submission)
            if self.search is not None:
                store_objectives(self.grid_dir, gate.results)
            rescued = self._rescue(gctx)
            return self._summary(rescued, embedded)
        finally:
            if owned:
                ray.shutdown()

    def _record(self) -> None:
        """Which grid file this submission runs and its composed recipe (``grid.json``,
        ``recipe.json`` in the grid's directory)."""
        grid = self.grid
        atomic_write_json(self.grid_dir / "grid.json", {
            "name": grid.name, "file": str(Path(grid.file).resolve()),
            "submission": self.submission, "submitted_at": self.started,
            "host": socket.gethostname()})
        atomic_write_json(self.grid_dir / "recipe.json", {"recipe": grid.spec.recipe,
                                                          "config": dict(grid.recipe_config)})

    def _prepare(self) -> None:
        """The trials' records ready to run: a search's earlier points read back, earlier cancel
        requests dropped, trials a dead orchestrator left RUNNING reset, and the outboxes of
        finished trials queued for the sender."""
        if self.search is not None:
            self.trials, self.prior = search_records(self.grid_dir)
        records.clear_cancel_requests(self.grid_dir, ["*"])  # a new submission means: run it
        self.trials = self.planner.initial(self.trials)  # adaptive seeds: the first `min` of each cell
        if self.owns_rescues:  # derived trials are the grid's too: repaired, reset, finished
            self.rescues = rescue_trials(self.grid_dir, [t.trial_id for t in self.trials])
        self.todo, finished = prepare_records(self.grid_dir, self.trials + self.rescues,
                                              self._repair)
        self.todo = park(self.grid_dir, self.todo, lambda t: self.skipped.get(t.trial_id))
        for tid in finished:  # what an earlier orchestrator left unsent (killed, or the store was down)
            self.sender.send(tid)
        self.already = len(finished) + len(self.prior)
        self.trial_pool = {t.trial_id: t.pool for t in self.todo}
        self.routes = self._routes(self.todo)

    def _repair(self, paths: TrialPaths, rec: records.TrialRecord) -> None:
        """A trial's damaged files repaired before it is judged (``_repair``), and said."""
        self.repaired += repair_trial(paths, rec, tracking_uri=self.tracking_uri,
                                      checkpoint=self.grid.spec.checkpoint)

    def _routes(self, trials: list[TrialSpec]) -> dict[str, str]:
        """The pool each trial's next attempt runs on (a resume request may move it)."""
        return {t.trial_id: records.route_pool(records.load_state(
            TrialPaths(self.grid_dir, t.trial_id), t.trial_id), t) for t in trials}

    def _pools(self) -> dict[str, PoolSpec]:
        """Every pool this submission may run on: known before Ray starts, since an embedded
        cluster only has resources for these. A finished trial's too: a rescue of it (one
        refused for budget before, or one a killed submission made) runs on its pool."""
        grid = self.grid
        every = set(self._routes(self.trials + self.rescues).values()) if self.policy else set()
        pools = {p: grid.pools.get(p)
                 for p in set(self.routes.values()) | every | set(grid.spec.budget.per_pool)}
        for entry in self.policy:  # a rescue may move a trial to its pool
            if entry.resume.pool:
                pools[entry.resume.pool] = grid.pools.get(entry.resume.pool)
        if self.search is not None:
            pools.update({lab: grid.pools.get(lab) for a in grid.axes if a.kind == "pool"
                          for lab in a.labels})
            if grid.spec.pool:
                pools[grid.spec.pool] = grid.pools.get(grid.spec.pool)
        return pools

    def _place(self, pools: dict[str, PoolSpec], embedded: bool) -> list[TrialSpec]:
        """Each pool as Ray resources with its capacity and limit; returns the trials that can
        run (the others stay PENDING with the reason, instead of hanging Tune)."""
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.placements = plan_placement(pools, embedded=embedded,
                                         cluster_resources=ray.cluster_resources(),
                                         node_labels=[n.get("Labels") or {} for n in nodes],
                                         elsewhere=backends.backend(self.grid.backend).computes_elsewhere)
        runnable = park_unplaceable(self.grid_dir, self.todo, self.placements, self.routes)
        budget = self.grid.spec.budget
        self.limits = {p: min(pl.capacity, budget.per_pool.get(p, pl.capacity))
                       for p, pl in self.placements.items()}
        self.standby = standby_slots(self.placements, self.limits, self.max_parallel)
        return runnable

    def _context(self, pools: dict[str, PoolSpec]) -> GridContext:
        grid = self.grid
        objective = grid.spec.search.objective if self.search is not None else None
        return GridContext(str(self.grid_dir), dict(grid.recipe_config), pools,
                           grid.spec.checkpoint, grid.spec.collapse, grid.spec.early_stop_spec,
                           self.tracking_uri, self.submission,
                           {grid.backend: backends.backend(grid.backend)}, objective,
                           grid.spec.retries.preemptions, self.policy)

    def _fit(self, gctx: GridContext, runnable: list[TrialSpec], routes: Mapping[str, str],
             budget: int, name: str) -> Any:
        """One Tune fit of ``runnable`` (and ``budget`` search points) through the gate; trials
        Tune gave up on end FAILED. Returns the gate (results and errors per trial)."""
        from orchestrator.scheduler._gate import PoolGate  # deferred: subclasses a ray class

        # How many workers the fit starts at once: the slots of the pools it will use.
        pools = set(self.limits) if budget else {routes.get(t.trial_id, t.pool) for t in runnable}
        workers = min(self.max_parallel, sum(self.limits.get(p, 0) for p in pools),
                      len(runnable) + budget)
        warm_up = [str(self.grid_dir / "tune" / name / ".workers"), workers]
        gate = PoolGate(self.grid_dir, runnable, self.limits, self.max_parallel, search=self.search,
                        search_budget=budget,
                        on_new_trial=functools.partial(remember_point, self.grid_dir),
                        extra_config=functools.partial(self._extra_config, warm_up),
                        standby=self.standby, hold=self._hold_for_store, planner=self.planner,
                        routes={t: p for t, p in routes.items() if p != self.trial_pool.get(t)},
                        rescue=self.rescuer.now if self.rescuer is not None else None)
        for stored, value in self.prior:
            gate.tell_previous(stored, value)
        live = LiveView(self.grid_dir, self.grid.name, gate, self.progress,
                        on_trial_over=self.sender.send,
                        abort=lambda: self.sender.error or fault_error(gate.results),
                        events=self.events)
        stop_credential_propagation()
        try:
            with tune_env(self.max_parallel + sum(self.standby.values())):
                tuner(gctx, gate, live, name, self.placements, self.grid_dir,
                      self.grid.spec.retries.max).fit()
        except Exception:
            if self.sender.error is not None:  # the store is unreachable: the callback stopped Tune
                raise self.sender.error from None
            if fault_error(gate.results) is not None:  # a trial's disk is full: the callback stopped Tune
                raise fault_error(gate.results) from None
            raise
        finally:
            live.stop()
            drop_tune_pickles(self.grid_dir / "tune" / name)
        if fault_error(gate.results) is not None:  # the fit ended before the callback saw it
            raise fault_error(gate.results)
        self.sender.drain()  # run ids in state.json before anything below reads them
        mark_exhausted(self.grid_dir, gate.errors, self.tracking_uri)
        return gate

    def _hold_for_store(self) -> bool:
        """A remote store may turn out unreachable: no trial starts before the parent run is
        open (the callback then stops Tune with the store's error). A local SQLite file cannot
        be "down", so there trials start while it opens."""
        return self.remote_store and self.sender.ready_target() is None and self.sender.error is None

    def _extra_config(self, warm_up: list[Any]) -> dict[str, Any]:
        """What each trial's config gets when it starts: the fit's warm-up barrier and, once the
        parent run is open, where the trial's MLflow run goes."""
        target = self.sender.ready_target()  # None while the parent run is being opened
        tracking = {"tracking": [target.experiment_id, target.parent_run_id]} if target else {}
        return {"warm_up": warm_up, **tracking}

    def _rescue(self, gctx: GridContext) -> list[TrialSpec]:
        """The rescue rounds after the fit (``Rescuer.rounds``), each another fit; every
        rescue this submission made."""
        if self.rescuer is None:
            return []
        return self.rescuer.rounds([t.trial_id for t in self.trials], lambda runnable, routes, n: (
            self._fit(gctx, runnable, routes, 0, f"{self.submission}-rescue{'' if n == 1 else n}")))

    def _summary(self, rescued: list[TrialSpec], embedded: bool) -> dict[str, Any]:
        """The JSON-safe summary, once MLflow has everything; ends the parent run."""
        parent = self.sender.wait()
        self.sender.drain()
        if self.events is not None:  # the failures `mark_exhausted` wrote, then the last counts
            self.events.poll()
            self.events.summary(unless_unchanged=True)
        trials, rescues = self._reported()
        summary = summarize(self.grid, self.grid_dir, trials + rescues)  # a rescue is a trial too
        summary["rescue_trials"] = len(rescues)
        summary["rescued"] = [t.trial_id for t in rescued]
        summary.update(grid_cost(self.grid_dir, self.grid.pools.pools), **self.planner.summary())
        parent.log_cost(total_metrics(summary["cost"]), {**cost_run_tags(summary), **rescue_links(self.grid_dir)})
        parent.publish_summaries(self.grid.name, self.grid_dir)  # compare elsewhere reads one file
        summary["repaired"] = self.repaired
        self.notifier.grid_end(summary, budget_out=self.planner.budget_out,
                               submission=self.submission)
        summary.update(submission=self.submission, elapsed_s=round(time.time() - self.started, 2),
                       skipped_finished=self.already,
                       tune_dir=str(self.grid_dir / "tune" / self.submission),
                       tracking_uri=self.tracking_uri, parent_run_id=parent.run_id,
                       ray="embedded" if embedded else "cluster")
        parent.end("FINISHED")
        return summary
