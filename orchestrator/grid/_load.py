"""Grid spec: load a grid file, validate it, expand it into content-hashed trials.

Pipeline (fixed): safe YAML load (``orchestrator.safeyaml``) -> pydantic schema (``schema``)
-> recipe compose with Hydra (``recipes``) -> semantic checks (``validation``) -> frozen
``GridSpec`` -> ``expand()`` (``expansion``) -> ``TrialSpec`` list. Every user mistake is a one-line
``GridError`` naming the file, line, key path, bad value, allowed values and a did-you-mean;
nothing is started.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import recipes
from orchestrator.exceptions import GridError
from orchestrator.grid._schema_errors import validate_schema
from orchestrator.grid._validation import SECTIONS, Axis, build
from orchestrator.pools import PoolCatalog, load_catalog
from orchestrator.safeyaml import format_path, load_yaml
from orchestrator.schema import GridFile
from orchestrator.trial import TrialSpec


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

    def trial_config(self, trial: TrialSpec) -> dict[str, Any]:
        """The full resolved config of a trial (recipe + its overrides) as a nested dict."""
        return recipes.apply_overrides(self.recipe_config, trial.override_map)


# --------------------------------------------------------------------------- loading



def load_grid(path: str | Path, *, backend: str | None = None,
              limit_trials: bool = False) -> GridSpec:
    """Load and validate a grid file. ``backend`` overrides the file's ``backend:``.

    ``limit_trials`` (callers that expand the grid without ``--force``): refuse a grid whose
    trials outnumber ``budget.max_trials`` as soon as the schema holds, before its values are
    checked one by one (a 150,000-seed grid is refused in a fraction of a second)."""
    file = str(path)
    data, lines = load_yaml(path)
    if backend is not None:
        data = {**data, "backend": backend}
    spec = validate_schema(data, lines, file)
    if limit_trials:
        _count_trials(spec, file, lines)
    try:
        catalog = load_catalog(_catalog_path(spec, file))
    except GridError as exc:  # name the grid's key too: the catalogue is read because of it
        raise GridError(str(exc).removeprefix("error: "), file=file,
                        line=lines.get(("pool_catalog",)), key="pool_catalog") from None
    root = recipes.recipes_root(path)
    base = recipes.compose_recipe(spec.recipe, root=root, file=file, line=lines.get(("recipe",)))
    for section, model in SECTIONS.items():
        given = base.get(section) or {}
        base[section] = {**model().model_dump(mode="json"), **given}
    return GridSpec(**build(spec, file, lines, base, str(root), catalog))


def _count_trials(spec: GridFile, file: str, lines: Mapping[tuple[Any, ...], int]) -> None:
    """The most trials the grid can expand to (axes x seeds + includes), from its shape."""
    seeds = len(spec.seed_values)
    bound = seeds
    for values in spec.axes.values():
        bound *= len(values)
    bound += len(spec.include) * seeds
    cap = spec.budget.max_trials
    if spec.search is None and bound > cap:
        raise GridError(f"grid expands to up to {bound} trials, over the limit {cap}", file=file,
                        line=lines.get(("budget", "max_trials"), lines.get(("budget",), 1)),
                        key="budget.max_trials",
                        fix="raise budget.max_trials, add excludes, or pass --force")


def _catalog_path(spec: GridFile, file: str) -> str | None:
    if spec.pool_catalog is None:
        return None
    p = Path(spec.pool_catalog)
    return str(p if p.is_absolute() else Path(file).resolve().parent / p)

