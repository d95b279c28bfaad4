"""Recipes: Hydra configs in ``recipes/`` that a grid's trials are composed from.

A recipe ``sim/grpo_tiny`` is the file ``recipes/sim/grpo_tiny.yaml``, composed with Hydra's
compose API (so ``defaults:`` lists work). Grids override its leaves by dotted key; a key that
is not in the recipe is an error (struct mode), as in Hydra.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from orchestrator.exceptions import GridError, UserError
from orchestrator.safeyaml import load_yaml, loads

REPO_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def recipes_root(grid_file: str | Path | None = None) -> Path:
    """Where recipes are looked up: $ABLATE_RECIPES, ./recipes, next to grids/, or the repo's."""
    candidates: list[Path] = []
    if os.environ.get("ABLATE_RECIPES"):
        candidates.append(Path(os.environ["ABLATE_RECIPES"]))
    if grid_file is not None:
        gf = Path(grid_file).resolve()
        candidates += [p / "recipes" for p in gf.parents[:3]]
    candidates += [Path.cwd() / "recipes", REPO_RECIPES]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    return REPO_RECIPES


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
    path = root / f"{name}.yaml"
    if ".." in name.split("/") or not os.path.lexists(path):
        raise GridError(f"unknown recipe {name!r} (looked in {root})", file=file, line=line,
                        key="recipe", allowed=available(root), got=name,
                        fix="name a file under recipes/ without the .yaml suffix")
    _check_files(path, root)
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


def _check_files(path: Path, root: Path) -> None:
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
            for candidate in (path.parent / f"{ref}.yaml", root / f"{ref}.yaml"):
                if ref != "_self_" and ".." not in ref.split("/") and os.path.lexists(candidate):
                    load_yaml(candidate)
                    break


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
