"""Recipes: Hydra configs that a grid's trials are composed from.

A recipe ``sim/grpo_tiny`` is the file ``sim/grpo_tiny.yaml`` under a recipes folder, composed
with Hydra's compose API (so ``defaults:`` lists work). Grids override its leaves by dotted key; a
key that is not in the recipe is an error (struct mode), as in Hydra.

A recipe name is looked up in these folders, the first that holds ``<name>.yaml`` wins (the
user's own first, the built-in ones last; :func:`search_path`):

1. the folder the grid's ``recipes_dir:`` key names (relative to the grid file);
2. each folder of ``$ABLATE_RECIPES`` (``os.pathsep``-separated);
3. ``recipes/`` next to the grid file, or in its parent or grandparent folder;
4. ``recipes/`` in the current folder;
5. the built-in recipes, shipped inside the package (``orchestrator/_recipes``, package data
   that the build maps from the checkout's top-level ``recipes/``) and found with
   ``importlib.resources``.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.exceptions import GridError, UserError
from orchestrator.safeyaml import load_yaml, loads

BUILTIN_PACKAGE_DIR = "_recipes"  # orchestrator/_recipes in a wheel (setup.py maps recipes/ there)


def _builtin_root() -> Path:
    """The built-in recipes: the package's ``_recipes`` data folder. A source checkout that is
    imported without being built (``PYTHONPATH=.``, a flat editable install) has no such folder;
    there the top-level ``recipes/`` the build would ship is the same set of files."""
    packaged = importlib.resources.files("orchestrator").joinpath(BUILTIN_PACKAGE_DIR)
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "recipes"


BUILTIN_RECIPES = _builtin_root()
REPO_RECIPES = BUILTIN_RECIPES  # the name tests and benchmarks use


def search_path(grid_file: str | Path | None = None,
                recipes_dir: str | None = None, *, line: int | None = None) -> list[Path]:
    """The folders a recipe name is looked up in, in order (see the module docstring); each
    once, the built-in folder last. A folder the grid's ``recipes_dir:`` or ``$ABLATE_RECIPES``
    names must be a folder: a typo, a file, a link loop or a missing folder is a one-line error,
    never a silent fall back to the built-in recipe of the same name."""
    named: list[Path] = []  # named by the grid or the environment: must exist
    base = Path(grid_file).resolve().parent if grid_file is not None else Path.cwd()
    file = str(grid_file) if grid_file is not None else None
    if recipes_dir:
        named.append(_named_folder(recipes_dir, base, file=file, line=line, key="recipes_dir"))
    named += [_named_folder(e.strip(), Path.cwd(), file=file, line=None, key="$ABLATE_RECIPES")
              for e in os.environ.get("ABLATE_RECIPES", "").split(os.pathsep) if e.strip()]
    found = [p / "recipes" for p in Path(grid_file).resolve().parents[:3]] if grid_file else []
    found.append(Path.cwd() / "recipes")
    out: list[Path] = []
    for c in [*named, *(c.resolve() for c in found if c.is_dir())]:
        if c != BUILTIN_RECIPES.resolve() and c not in out:
            out.append(c)
    return [*out, BUILTIN_RECIPES]


def _named_folder(text: str, base: Path, *, file: str | None, line: int | None,
                  key: str) -> Path:
    """The folder ``text`` names (relative to ``base``), resolved; a one-line error if it is
    not one, with the folders beside it that it may have meant."""
    import difflib

    given = Path(text).expanduser()
    path = given if given.is_absolute() else base / given
    try:
        real = path.resolve(strict=True)
    except RuntimeError:
        problem = "is a symbolic link loop"
    except OSError:
        problem = "does not exist"
    else:
        if real.is_dir():
            return real
        problem = "is a file, not a folder"
    parent = path.parent
    near = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    guess = difflib.get_close_matches(path.name, near, n=1)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    where = "the grid file's folder" if key == "recipes_dir" else "the current folder"
    raise GridError(f"{text!r} {problem}{hint}; a recipe is looked up there first, and would "
                    "otherwise come from the built-in recipes", file=file, line=line, key=key,
                    fix=f"name an existing recipes folder (relative to {where})")


def recipes_root(grid_file: str | Path | None = None) -> Path:
    """The first existing folder of :func:`search_path` (where new recipe names resolve first)."""
    return next(p for p in search_path(grid_file) if p.is_dir() or p == BUILTIN_RECIPES)


def locate(name: str, places: Sequence[Path], *, file: str | None = None,
           line: int | None = None) -> Path:
    """The first folder of ``places`` that holds the recipe ``name``; else a one-line error
    naming every folder looked in and the built-in recipe names."""
    for root in places:
        if recipe_file(root, name, file=file, line=line) is not None:
            return root
    looked = ", ".join(str(p) for p in places[:-1])
    looked += f"{', then ' if looked else ''}the built-in recipes ({places[-1]})"
    names = sorted({n for p in places if p.is_dir() for n in available(p)})
    raise GridError(f"unknown recipe {name!r} (looked in {looked})", file=file, line=line,
                    key="recipe", allowed=names, got=name,
                    fix="name a recipe file without its .yaml suffix, relative to one of these "
                    "folders (add yours with the grid key recipes_dir: or $ABLATE_RECIPES)")


def data_path(value: str, checkout: Path) -> str:
    """A file path a recipe value holds (verl's ``function_tool_path``, ...) as an absolute path:
    ``recipes/X`` is the built-in recipes' file ``X`` (package data: there in an installed
    package too); any other relative path is taken relative to ``checkout``."""
    path = Path(value)
    if path.is_absolute():
        return value
    if path.parts[:1] == ("recipes",):
        return str(BUILTIN_RECIPES.joinpath(*path.parts[1:]))
    return str(checkout / path)


def available(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root).with_suffix(""))
        for p in root.rglob("*.yaml")
        if not p.name.startswith("_") and "pools" != p.stem
    )


@functools.lru_cache(maxsize=32)
def _compose(root: str, name: str) -> str:
    # Hydra keeps global state; compose in a fresh context every time and cache the result.
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=root, version_base=None):
            cfg = compose(config_name=name)
        data = OmegaConf.to_container(cfg, resolve=True)
    finally:
        GlobalHydra.instance().clear()
    return json.dumps(data, sort_keys=True)


def compose_recipe(name: str, *, root: Path, file: str | None = None,
                   line: int | None = None) -> dict[str, Any]:
    """The composed recipe as a plain dict (a fresh copy each call)."""
    path = recipe_file(root, name, file=file, line=line)
    if path is None:
        raise GridError(f"unknown recipe {name!r} (looked in {root})", file=file, line=line,
                        key="recipe", allowed=available(root), got=name,
                        fix="name a file under that folder without the .yaml suffix")
    _check_files(path, root, file=file, line=line)
    try:
        text = _compose(str(root), name)
    except Exception as exc:  # noqa: BLE001 - any Hydra/OmegaConf failure is a recipe error
        detail = " ".join(str(exc).split())[:300]
        raise GridError(f"recipe {name!r} does not compose: {detail}", file=file, line=line,
                        key="recipe", fix=f"fix {root / (name + '.yaml')}") from None
    data = json.loads(text)
    # Hydra packages a config named "sim/grpo_tiny" under the keys sim.grpo_tiny's group path
    # ("sim"); a recipe is a whole trial config, so unwrap that nesting.
    for part in name.split("/")[:-1]:
        if isinstance(data, dict) and set(data) == {part}:
            data = data[part]
    if not isinstance(data, dict):
        raise GridError(f"recipe {name!r} is not a mapping", file=file, line=line, key="recipe")
    return data


def recipe_file(root: Path, ref: str, *, file: str | None = None,
                line: int | None = None) -> Path | None:
    """``root/<ref>.yaml`` if it is there, else None: the one resolver of recipe files (the
    recipe and the files its ``defaults:`` list names). ``..`` is not a recipe name, and a file
    that is (or lies under) a link leaving ``root`` is refused without being read: a recipe
    folder must not read another user's files into an error message or a trial's config."""
    if ".." in ref.split("/"):
        return None
    path = root / f"{ref}.yaml"
    if not os.path.lexists(path):
        return None
    try:
        real = path.resolve(strict=True)
        inside = real.is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):
        raise GridError(f"recipe file {path} is a broken link or a link loop", file=file,
                        line=line, key="recipe", fix="point the link at a file inside "
                        f"{root}, or replace it by the file") from None
    if not inside:
        raise GridError(f"recipe file {path} is a link to a file outside the recipes folder "
                        f"{root}, which is not read", file=file, line=line, key="recipe",
                        fix="copy the file into the recipes folder instead of linking it")
    return path


def _check_files(path: Path, root: Path, *, file: str | None = None,
                 line: int | None = None) -> None:
    """Read the recipe and the files its ``defaults:`` list names with the safe reader before
    Hydra does: a regular file under the size cap, no bombs, decimal numbers (Hydra's YAML 1.1
    would read ``1:30`` as 90)."""
    data, _ = load_yaml(path)
    for entry in data.get("defaults") or []:
        names = [entry] if isinstance(entry, str) else (
            [f"{k}/{v}" for k, v in entry.items() if isinstance(v, str)]
            if isinstance(entry, dict) else [])
        for ref in names:
            ref = ref.lstrip("/").removeprefix("override ")
            if ref == "_self_":
                continue
            candidate = (recipe_file(path.parent, ref, file=file, line=line)
                         or recipe_file(root, ref, file=file, line=line))
            if candidate is not None:
                load_yaml(candidate)


# Vocabulary keys added after trial-id scheme 2, per section: hashed into a recipe's digest only
# when set. At their default (null: the backend's own behaviour) they change no number, so they
# must not change the id of every trial of every recipe that was composed before they existed
# (the loader fills each section's defaults in). Append here when a section gains a key.
LATE_KEYS: dict[str, frozenset[str]] = {
    "learner": frozenset({"clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode"}),
}


def digest(config: Mapping[str, Any]) -> str:
    """The recipe part of a trial id: the composed config, late keys at their default left out."""
    stable = dict(config)
    for section, late in LATE_KEYS.items():
        if isinstance(stable.get(section), Mapping):
            stable[section] = {k: v for k, v in stable[section].items()
                               if not (k in late and v is None)}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaves of a nested mapping as (dotted key, value); empty mappings are leaves."""
    for k, v in config.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            yield from flatten(v, key)
        else:
            yield key, v


def apply_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with dotted-key overrides set (keys are validated beforehand)."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = list(value) if isinstance(value, tuple) else value
    return out


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` command-line pairs; VALUE is YAML (``true``, ``[0.5, 2.0]``, ``sequence``).

    Read like a grid file (``orchestrator.safeyaml``): ``2e-3`` is a float, and YAML 1.1 number
    spellings (``1:30``, ``010``, ``0x10``, ``1_000``) are refused, not reinterpreted.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. correction.is_level=sequence")
        try:
            value, _ = loads(text, file=f"--set {key.strip()}")
        except GridError as exc:
            raise UserError(str(exc)) from None
        if isinstance(value, str):
            try:
                value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "+inf",
                                                                       "infinity") else value
            except ValueError:
                pass
        out[key.strip()] = value
    return out
