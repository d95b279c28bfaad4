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
from orchestrator.backends import launched_on, trainer_names, trainers_of
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
    if isinstance(spec.recipe, dict):
        spec = spec.model_copy(update={"recipe": _recipe_for(spec, file, lines)})
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


def _recipe_for(spec: GridFile, file: str, lines: Mapping[tuple[Any, ...], int]) -> str:
    """The recipe of the backend's trainer from a ``recipe:`` given per trainer."""
    given: dict[str, str] = dict(spec.recipe)  # type: ignore[arg-type]
    known = trainer_names()
    for name in given:
        if name not in known:
            raise GridError(f"{name!r} is not a trainer", file=file, line=lines.get(("recipe", name)),
                            key=f"recipe.{name}", allowed=known, got=name)
    runs = trainers_of(spec.backend)
    mine = [t for t in runs if t in given]
    if len(mine) == 1:
        return given[mine[0]]
    if not mine:
        raise GridError(f"no recipe for backend {spec.backend!r}, whose trainer is "
                        f"{' or '.join(runs)}", file=file, line=lines.get(("recipe",)),
                        key="recipe", fix=f"add 'recipe.{runs[0]}: <recipe>', or change 'backend:'")
    raise GridError(f"backend {spec.backend!r} runs {' and '.join(mine)} (by pool kind), and a "
                    "grid has one recipe", file=file, line=lines.get(("recipe",)), key="recipe",
                    fix=f"keep one of recipe.{' and recipe.'.join(mine)}, or give one recipe name")


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

