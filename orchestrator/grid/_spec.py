"""What a validated grid is: ``GridSpec``, its axes (``Axis``, ``axis_label``) and the
config sections every trial carries typed (``SECTIONS``).

Apart from loading (``_load``) and the checks (``_validation``, ``_cells``, ``_adaptive``)
because all of those, and expansion, need these types: here at the bottom of ``grid/``, no
module of the package imports another in a circle.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from orchestrator import recipes
from orchestrator.backends.config import TrialConfig
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import GridError
from orchestrator.learner import LearnerSpec
from orchestrator.pools import PoolCatalog
from orchestrator.safeyaml import format_path
from orchestrator.schema import GridFile
from orchestrator.trial import TrialSpec

SECTIONS: dict[str, type[BaseModel]] = {"correction": CorrectionSpec, "rollout": RolloutSpec,
                                        "learner": LearnerSpec}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One grid axis: a label and the dotted-key overrides for each of its values."""

    name: str
    kind: str  # "value" (list of values for a config key) | "bundle" (named sets) | "pool"
    labels: tuple[str, ...]
    overrides: tuple[tuple[tuple[str, Any], ...], ...]

    def index_of(self, label: str) -> int:
        return self.labels.index(label)


def axis_label(value: Any) -> str:
    """An axis value as its label (tables, MLflow params, exclude rules): a string as it is,
    anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """A validated grid; ``expand(grid)`` yields its trials."""

    file: str
    spec: GridFile
    axes: tuple[Axis, ...]
    fixed: tuple[tuple[str, Any], ...]
    recipe_config: Mapping[str, Any]
    recipe_digest: str
    recipes_root: str
    pools: PoolCatalog
    excludes: tuple[tuple[tuple[int, frozenset[int]], ...], ...]
    includes: tuple[tuple[tuple[str, str], ...], ...]
    lines: Mapping[tuple[Any, ...], int]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def upper_bound(self) -> int:
        n = len(self.spec.seed_values)
        for a in self.axes:
            n *= len(a.labels)
        return n + len(self.includes) * len(self.spec.seed_values)

    def line(self, *path: Any) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def error(self, problem: str, *path: Any, **kw: Any) -> GridError:
        return GridError(problem, file=self.file, line=self.line(*path),
                         key=format_path(tuple(path)) or None, **kw)

    @property
    def base_config(self) -> dict[str, Any]:
        """The recipe with the grid's fixed ``overrides:`` applied (what every trial shares)."""
        return recipes.apply_overrides(self.recipe_config, dict(self.fixed))

    def trial_config(self, trial: TrialSpec, pool: str | None = None) -> TrialConfig:
        """A trial's configuration (recipe + its overrides, typed) on its pool, or on ``pool``
        (``ablate resume --pool`` moves a trial)."""
        return TrialConfig.resolve(self.recipe_config, trial.override_map,
                                   self.pools.get(pool or trial.pool))
