"""Loading a grid: the file read safely, its schema and recipe checked, a ``GridSpec`` built.

Pipeline (fixed): safe YAML load (``orchestrator.safeyaml``) -> pydantic schema (``schema``)
-> recipe compose with Hydra (``recipes``) -> semantic checks (``validation``) -> frozen
``GridSpec`` (``_spec``) -> ``expand()`` (``expansion``) -> ``TrialSpec`` list. Every user mistake is a one-line
``GridError`` naming the file, line, key path, bad value, allowed values and a did-you-mean;
nothing is started.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import recipes
from orchestrator.backends import launched_on
from orchestrator.exceptions import GridError
from orchestrator.grid._schema_errors import validate_schema
from orchestrator.grid._spec import SECTIONS, GridSpec
from orchestrator.grid._validation import build
from orchestrator.pools import load_catalog
from orchestrator.safeyaml import load_yaml
from orchestrator.schema import GridFile


def load_grid(path: str | Path, *, backend: str | None = None,
              limit_trials: bool = False) -> GridSpec:
    """Load and validate a grid file. ``backend`` overrides the file's ``backend:`` (a
    launcher's name launches the file's trainers there: ``backends.launched_on``).

    ``limit_trials`` (callers that expand the grid without ``--force``): refuse a grid whose
    trials outnumber ``budget.max_trials`` as soon as the schema holds, before its values are
    checked one by one (a 150,000-seed grid is refused in a fraction of a second)."""
    file = str(path)
    data, lines = load_yaml(path)
    if backend is not None:  # ``--backend slurm`` on a Miles grid: Miles, launched on Slurm
        data = {**data, "backend": launched_on(backend, data.get("backend"))}
    spec = validate_schema(data, lines, file)
    if limit_trials:
        _count_trials(spec, file, lines)
    try:
        catalog = load_catalog(_catalog_path(spec, file))
    except GridError as exc:  # name the grid's key too: the catalogue is read because of it
        raise GridError(str(exc).removeprefix("error: "), file=file,
                        line=lines.get(("pool_catalog",)), key="pool_catalog") from None
    places = recipes.search_path(path, spec.recipes_dir, line=lines.get(("recipes_dir",)))
    root = recipes.locate(spec.recipe, places, file=file, line=lines.get(("recipe",)))
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

