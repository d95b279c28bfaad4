"""The Ray Tune searcher that feeds grid trials to Tune under the grid's concurrency limits.

Ray Tune has one global limit (``max_concurrent_trials``) and none per group of trials, and a
trial it cannot place waits forever. So the scheduler hands Tune trials through this searcher:
``suggest`` returns the first queued trial whose pool has room (per-pool limit = min(cluster
capacity of the pool, ``budget.per_pool``)) while fewer than ``budget.max_parallel`` run, and
``None`` ("ask again later") otherwise. Queued trials of a full pool never block other pools.

A pool whose limit is its whole Ray capacity gets one *standby* trial beyond it (``standby``,
only when the grid limit cannot be exceeded either): Tune stages it, Ray cannot place it until a
slot frees, and the moment a trial ends Tune hands its live worker to the standby one. Without
it Tune starts a new worker process for the next trial, and a finishing trial's cached worker
is then given to that trial instead, so under load one slot per pool stays "starting" forever.

With a ``search:`` section the same gate wraps Ray Tune's ``OptunaSearch``
(``_search.SearchSpace``): each Optuna point becomes a content-hashed trial
(``grid.search_trial``); a point that ran before (this or an earlier submission) is answered
from its stored objective instead of being run again.
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from orchestrator.scheduler._budget import Admit, Planner
from orchestrator.scheduler._search import SearchSpace
from orchestrator.store import TrialPaths, records
from orchestrator.trial import TrialSpec

log = logging.getLogger(__name__)


class PoolGate(Searcher):
    """Suggests queued trials (and search points) within the per-grid and per-pool limits."""

    def __init__(self, grid_dir: Path, queue: list[TrialSpec], limits: Mapping[str, int],
                 max_parallel: int, *, search: SearchSpace | None = None, search_budget: int = 0,
                 on_new_trial: Callable[[TrialSpec, dict[str, Any]], None] | None = None,
                 routes: Mapping[str, str] | None = None,
                 extra_config: Callable[[], Mapping[str, Any]] | None = None,
                 standby: Mapping[str, int] | None = None,
                 hold: Callable[[], bool] | None = None, planner: Planner | None = None,
                 rescue: Callable[[str], list[tuple[TrialSpec, str]]] | None = None) -> None:
        super().__init__()
        self.grid_dir = Path(grid_dir)
        self.queue = list(queue)
        self.routes = dict(routes or {})  # trial id -> pool, when not the trial's own (resume)
        self.limits = dict(limits)
        self.max_parallel = max_parallel
        self.standby = dict(standby or {})  # pool -> trials staged beyond its limit (see above)
        self.running: dict[str, tuple[str, str]] = {}  # tune id -> (trial id, pool)
        self.search = search
        self.inner = search.searcher() if search is not None else None
        self.search_left = search_budget
        self.inner_ids: dict[str, list[str]] = {}  # trial id -> optuna-side ids awaiting its result
        self._held: TrialSpec | None = None  # a search trial waiting for room on its pool
        self._n = 0
        self.on_new_trial = on_new_trial
        self.extra_config = extra_config  # more keys for each trial's config, read when it starts
        self.hold = hold  # while it returns True nothing starts (e.g. a remote MLflow store unchecked)
        self.results: dict[str, dict[str, Any]] = {}
        self.errors: set[str] = set()
        # Budgets and adaptive seeds (``_budget``): asked before a queued trial starts, and for
        # the next seed when the queue is empty.
        self.planner = planner if planner is not None and planner.active else None
        # The grid's rescue policy, asked as each trial ends: the trials it queues, each with
        # the pool it runs on. While trials run, one of them may still bring a rescue, so the
        # fit is not finished before the last one ends.
        self.rescue = rescue

    # Tune calls these when it wraps searchers; the gate enforces limits itself.
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return True

    def pool_of(self, trial: TrialSpec) -> str:
        return self.routes.get(trial.trial_id, trial.pool)

    def pool_running(self, pool: str) -> int:
        return sum(1 for _, p in self.running.values() if p == pool)

    def _room(self, pool: str) -> bool:
        return self.pool_running(pool) < self.limits.get(pool, 0) + self.standby.get(pool, 0)

    def _grid_full(self) -> bool:
        return len(self.running) >= self.max_parallel + sum(self.standby.values())

    def reasons(self) -> dict[str, str]:
        """Why each queued trial waits (written to queue.json for ``ablate status``)."""
        out = {tid: f"starting on pool {pool}" for tid, pool in self.running.values()}
        for t in self.queue + ([self._held] if self._held else []):
            if self._grid_full():
                out[t.trial_id] = f"queued: grid limit max_parallel={self.max_parallel} reached"
            elif self.planner is not None and t.trial_id in self.planner.held:
                out[t.trial_id] = self.planner.held[t.trial_id]
            elif not self._room(self.pool_of(t)):
                p = self.pool_of(t)
                out[t.trial_id] = (f"queued: pool {p} full ({self.pool_running(p)}/"
                                   f"{self.limits.get(p, 0)} running)")
            else:
                out[t.trial_id] = "queued: starting"
        return out

    def finished(self) -> bool:
        return (not self.queue and self._held is None and (self.inner is None or self.search_left <= 0)
                and (self.planner is None or not self.planner.waiting(self.running))
                and (self.rescue is None or not self.running))

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if records.cancel_requests(self.grid_dir).get("*"):
            for t in self.queue + ([self._held] if self._held else []):
                records.mark_cancelled(self.grid_dir, t.trial_id)
            self.queue, self._held, self.search_left = [], None, 0
        if self.finished():
            return Searcher.FINISHED
        if self._grid_full() or (self.hold is not None and self.hold()):
            return None
        trial = self._next_queued() or self._next_search() or self._next_seed()
        if trial is None:
            return Searcher.FINISHED if self.finished() else None
        pool = self.pool_of(trial)
        self.running[trial_id] = (trial.trial_id, pool)
        extra = dict(self.extra_config()) if self.extra_config is not None else {}
        return {"trial_id": trial.trial_id, "trial": trial.to_json(), "pool": pool, **extra}

    def _next_queued(self) -> TrialSpec | None:
        i = 0
        while i < len(self.queue):  # a loop, not recursion: a budget may skip thousands at once
            t = self.queue[i]
            if not self._room(self.pool_of(t)):
                i += 1
                continue
            rec = records.load_state(TrialPaths(self.grid_dir, t.trial_id), t.trial_id)
            if rec.state.is_finished():  # cancelled meanwhile (or finished by another path)
                self.queue.pop(i)
                continue
            if self.planner is not None:
                verdict = self.planner.admit(t, self.pool_of(t), self.running.values())
                if verdict is Admit.WAIT:
                    i += 1
                    continue
                if verdict is Admit.SKIP:
                    self.queue.pop(i)
                    rec.pending_reason = self.planner.skip_reason(t, self.pool_of(t))
                    records.save_state(TrialPaths(self.grid_dir, t.trial_id), rec)
                    continue
            return self.queue.pop(i)
        return None

    def _next_seed(self) -> TrialSpec | None:
        """The next adaptive seed (``_budget.Planner``), through the same checks as a queued one."""
        if self.planner is None or self.queue:
            return None
        trial = self.planner.next_seed(())
        if trial is None:
            return None
        self.queue.append(trial)
        return self._next_queued()

    def _next_search(self) -> TrialSpec | None:
        if self.inner is None or self.search is None:
            return None
        if self._held is not None:
            return self._take_held()
        for _ in range(20):  # answer repeated points from storage, then ask again
            if self.search_left <= 0:
                return None
            self._n += 1
            inner_id = f"optuna-{self._n}"
            point = self.inner.suggest(inner_id)
            if point is None or point == Searcher.FINISHED:
                return None
            trial, stored = self.search.trial(point)
            self.inner_ids.setdefault(trial.trial_id, []).append(inner_id)
            rec = records.load_state(TrialPaths(self.grid_dir, trial.trial_id), trial.trial_id)
            if rec.state.is_finished():
                self._answer(trial.trial_id, rec.objective, error=rec.objective is None)
                continue
            if len(self.inner_ids[trial.trial_id]) > 1:
                continue  # the same point is already running: it answers both
            if self._budget_ends_search(trial):
                return None
            self.search_left -= 1
            if self.on_new_trial is not None:
                self.on_new_trial(trial, stored)
            self._held = trial
            return self._take_held()
        return None

    def _take_held(self) -> TrialSpec | None:
        """The held search point if its pool has room and the budget lets it start now (it
        waits, like a queued trial, while running trials' projected cost would overrun; skipped,
        it stays pending with the reason, for a re-submit, and the search ends)."""
        trial = self._held
        if trial is None or not self._room(trial.pool):
            return None
        if self.planner is not None:
            verdict = self.planner.admit(trial, trial.pool, self.running.values())
            if verdict is Admit.WAIT:
                return None
            if verdict is Admit.SKIP:
                paths = TrialPaths(self.grid_dir, trial.trial_id)
                rec = records.load_state(paths, trial.trial_id)
                rec.pending_reason = self.planner.skip_reason(trial, trial.pool)
                records.save_state(paths, rec)
                self._end_search_for_budget(trial)
                return None
        self._held = None
        return trial

    def _budget_ends_search(self, trial: TrialSpec) -> bool:
        """A new search point the accelerator-hour budget cannot pay for ends the search: it is
        not recorded, and the points left are reported as not started for budget; a re-submit
        with a larger budget asks for them again."""
        if self.planner is None:
            return False
        if self.planner.admit(trial, trial.pool, self.running.values()) is not Admit.SKIP:
            self.planner.started.discard(trial.trial_id)  # counted when it really starts
            return False
        self._end_search_for_budget(trial)
        return True

    def _end_search_for_budget(self, trial: TrialSpec) -> None:
        assert self.planner is not None
        self.planner.search_stopped(self.search_left + (self._held is trial),
                                    self.planner.skipped.pop(trial.trial_id, 0.0))
        self._held = None
        self._answer(trial.trial_id, None, error=True)  # Optuna hears the point failed
        self.search_left = 0

    def _answer(self, trial_id: str, objective: float | None, *, error: bool) -> None:
        if self.inner is None:
            return
        for inner_id in self.inner_ids.pop(trial_id, []):
            ok = not error and objective is not None and math.isfinite(objective)
            self.inner.on_trial_complete(inner_id, result={"objective": objective} if ok else None,
                                         error=not ok)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        entry = self.running.pop(trial_id, None)
        if entry is None:
            return
        tid = entry[0]
        if error:
            self.errors.add(tid)
        if result:
            self.results[tid] = result
        self._answer(tid, (result or {}).get("objective"), error=error)
        if self.rescue is not None and not error:
            self._queue_rescues(tid)

    def _queue_rescues(self, tid: str) -> None:
        """The rescues of trial ``tid``, queued in this fit: a collapse or a warning is acted on
        when the trial ends, not once every trial of the grid has (a trial Tune gave up on is
        marked failed after the fit; the submission's rescue round takes that one)."""
        try:
            found = self.rescue(tid) if self.rescue is not None else []
        except Exception:  # never into Tune's loop: the rescue round after the fit tries again
            log.exception("trial %s: its rescue could not be planned now; tried again after the fit", tid)
            return
        queued = {t.trial_id for t in self.queue} | {t for t, _ in self.running.values()}
        for trial, pool in found:
            if trial.trial_id not in queued:
                self.queue.append(trial)
                self.routes[trial.trial_id] = pool
                queued.add(trial.trial_id)

    def tell_previous(self, stored: Mapping[str, Any], objective: float | None) -> None:
        """Teach Optuna a point an earlier submission already evaluated."""
        if self.inner is None or objective is None or not math.isfinite(objective):
            return
        self.inner.add_evaluated_point(SearchSpace.point(stored), objective)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its search algorithm into tuner.pkl (for Tuner.restore, which we never
        # use); the hooks close over the submission's live objects (locks, threads).
        return {**self.__dict__, "on_new_trial": None, "extra_config": None, "hold": None,
                "planner": None, "rescue": None}

    def save(self, checkpoint_path: str) -> None:
        # Tune checkpoints searchers; the durable truth is in the trial records, so JSON counters
        # are enough (and no pickle lands on disk).
        Path(checkpoint_path).write_text(json.dumps({"running": list(self.running.values()),
                                                     "search_left": self.search_left}))

    def restore(self, checkpoint_path: str) -> None:
        log.info("PoolGate.restore(%s): state is rebuilt from trial records instead", checkpoint_path)
