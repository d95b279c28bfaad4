"""The ``search:`` section: its Optuna space, the objective of a finished trial, and what
earlier submissions of a search left (points to resume, points to teach Optuna).

Each Optuna point becomes a content-hashed trial (``grid.search_trial``); a searched key is a
leaf (``train.lr``) or one element of a list value (``correction.is_bounds[1]``, the IS upper
bound), checked at plan time (``grid._validation``). ``_gate.PoolGate`` asks Optuna for points.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.grid import search_trial
from orchestrator.schema import SearchObjective
from orchestrator.store import TrialPaths, records
from orchestrator.trial import TrialSpec

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

AXIS_PREFIX = "axis:"


class SearchSpace:
    """Optuna side of a ``search:`` section: distributions, sampler, mapping back to a trial."""

    def __init__(self, grid: GridSpec) -> None:
        self.grid = grid
        self.spec = grid.spec.search
        self.seed = grid.spec.seed_values[0]

    def distributions(self) -> dict[str, Any]:
        import optuna.distributions as d

        space: dict[str, Any] = {}
        for key, p in self.spec.params.items():
            if p.kind == "int":
                space[key] = d.IntDistribution(int(p.low), int(p.high), log=p.log)
            else:
                space[key] = d.FloatDistribution(float(p.low), float(p.high), log=p.log)
        for axis in self.grid.axes:
            if len(axis.labels) > 1:  # categorical axes are searched too; one label is fixed
                space[AXIS_PREFIX + axis.name] = d.CategoricalDistribution(list(axis.labels))
        return space

    def searcher(self) -> Any:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        sampler = (optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=min(4, self.spec.budget))
                   if self.spec.sampler == "tpe" else optuna.samplers.RandomSampler(seed=self.seed))
        return OptunaSearch(space=self.distributions(), metric="objective",
                            mode=self.spec.objective.mode, sampler=sampler)

    def trial(self, point: Mapping[str, Any]) -> tuple[TrialSpec, dict[str, Any]]:
        """The trial for an Optuna point, and the point as stored in state.json."""
        params: dict[str, Any] = {}
        for key, p in self.spec.params.items():
            v = point[key]
            params[key] = int(v) if p.kind == "int" else float(f"{float(v):.4g}")
        choices = {k[len(AXIS_PREFIX):]: v for k, v in point.items() if k.startswith(AXIS_PREFIX)}
        trial = search_trial(self.grid, params, choices, self.seed)
        return trial, {"params": params, "choices": choices}

    @staticmethod
    def point(stored: Mapping[str, Any]) -> dict[str, Any]:
        return {**stored["params"], **{AXIS_PREFIX + k: v for k, v in stored["choices"].items()}}

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


def search_records(grid_dir: Path) -> tuple[list[TrialSpec], list[tuple[dict[str, Any], float | None]]]:
    """Search trials of earlier submissions: unfinished ones to resume, finished ones to teach."""
    unfinished, done = [], []
    for tid, spec in records.known_trials(grid_dir).items():
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        if rec.search is None:
            continue
        if rec.state.is_finished():
            done.append((rec.search, rec.objective))
        else:
            unfinished.append(spec)
    return unfinished, done


def store_objectives(grid_dir: Path, results: Mapping[str, Mapping[str, Any]]) -> None:
    for tid, res in results.items():
        if "objective" in res:
            paths = TrialPaths(grid_dir, tid)
            rec = records.load_state(paths, tid)
            rec.objective = float(res["objective"])
            records.save_state(paths, rec)
