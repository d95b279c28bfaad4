"""Grid spec: load a grid file, validate it, expand it into content-hashed trials.

Pipeline (fixed): safe YAML load -> pydantic schema (``schema.py``) -> recipe compose (Hydra)
-> semantic checks (axis keys against the recipe, axis values against the correction/engine
vocabularies and the pool catalogue, excludes against the axes) -> frozen ``GridSpec`` ->
``expand()`` -> ``TrialSpec`` list. Every user mistake is a one-line ``GridError`` naming the
file, line, key path, bad value, allowed values and a did-you-mean; nothing is started.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import recipes
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.exceptions import GridError, did_you_mean
from orchestrator.pools import PoolCatalog, load_catalog
from orchestrator.schema import GridFile
from orchestrator.trial import TrialSpec, trial_id_for
from orchestrator.yamlsafe import LineMap, format_path, load_yaml

SECTIONS: dict[str, type[BaseModel]] = {"correction": CorrectionSpec, "rollout": RolloutSpec}
RESERVED_AXES = ("seed", "steps", "backend", "recipe")


@dataclasses.dataclass(frozen=True)
class Axis:
    """One grid axis: a label and the dotted-key overrides for each of its values."""

    name: str
    kind: str  # "value" (list of values for a config key) | "bundle" (named sets) | "pool"
    labels: tuple[str, ...]
    overrides: tuple[tuple[tuple[str, Any], ...], ...]

    def index_of(self, label: str) -> int:
        return self.labels.index(label)


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
        n = len(self.spec.seeds)
        for a in self.axes:
            n *= len(a.labels)
        return n + len(self.includes) * len(self.spec.seeds)

    def line(self, *path: Any) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def error(self, problem: str, *path: Any, **kw: Any) -> GridError:
        return GridError(problem, file=self.file, line=self.line(*path),
                         key=format_path(tuple(path)) or None, **kw)

    def trial_config(self, trial: TrialSpec) -> dict[str, Any]:
        """The full resolved config of a trial (recipe + its overrides) as a nested dict."""
        return recipes.apply_overrides(self.recipe_config, trial.override_map)


# --------------------------------------------------------------------------- loading


def load_grid(path: str | Path, *, backend: str | None = None) -> GridSpec:
    """Load and validate a grid file. ``backend`` overrides the file's ``backend:``."""
    file = str(path)
    data, lines = load_yaml(path)
    if backend is not None:
        data = {**data, "backend": backend}
    spec = _validate_schema(data, lines, file)
    catalog = load_catalog(_catalog_path(spec, file))
    root = recipes.recipes_root(path)
    base = recipes.compose_recipe(spec.recipe, root=root, file=file, line=lines.get(("recipe",)))
    for section, model in SECTIONS.items():
        given = base.get(section) or {}
        base[section] = {**model().model_dump(mode="json"), **given}
    return _build(spec, file, lines, base, str(root), catalog)


def _catalog_path(spec: GridFile, file: str) -> str | None:
    if spec.pool_catalog is None:
        return None
    p = Path(spec.pool_catalog)
    return str(p if p.is_absolute() else Path(file).resolve().parent / p)


def _validate_schema(data: dict[str, Any], lines: LineMap, file: str) -> GridFile:
    try:
        return GridFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        loc = _trim_union_loc(loc, data)
        allowed, got, problem = _explain(err, data, loc)
        line = None
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in lines:
                line = lines[loc[:cut]]
                break
        raise GridError(problem, file=file, line=line, key=format_path(loc) or None,
                        allowed=allowed, got=got) from None


def _trim_union_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    # pydantic adds union-member names (e.g. "list[...]", "int") to locations; keep real keys.
    out: list[Any] = []
    node = data
    for p in loc:
        if isinstance(node, Mapping) and p in node:
            out.append(p)
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and p < len(node):
            out.append(p)
            node = node[p]
    return tuple(out) if out else loc[:1]


def _explain(err: Mapping[str, Any], data: Any, loc: tuple[Any, ...]) -> tuple[
        list[str] | None, Any, str]:
    kind = err["type"]
    if kind == "extra_forbidden":
        parent: Any = data
        for p in loc[:-1]:
            parent = parent[p] if isinstance(parent, (Mapping, list)) else None
        allowed = _known_fields(loc[:-1])
        return allowed, loc[-1] if loc else None, f"unknown key {loc[-1]!r}" if loc else "unknown key"
    got = err.get("input")
    if kind in ("literal_error", "enum"):
        expected = err.get("ctx", {}).get("expected", "")
        allowed = [s.strip().strip("'\"") for s in expected.replace(" or ", ",").split(",") if s.strip()]
        return allowed, got, f"{_short(got)} is not an allowed value"
    if kind == "missing":
        return None, None, "required key is missing"
    msg = err.get("msg", "invalid value")
    return None, None, f"{_short(got)}: {msg}" if got is not None else msg


def _known_fields(loc: tuple[Any, ...]) -> list[str] | None:
    model: Any = GridFile
    for p in loc:
        if isinstance(p, int):
            continue
        field = getattr(model, "model_fields", {}).get(p)
        if field is None:
            return None
        model = _model_in(field.annotation)
        if model is None:
            return None
    return sorted(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------- semantic checks


def _label(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _allowed_values(model: type[BaseModel], field: str) -> list[str] | None:
    ann = model.model_fields[field].annotation
    lits: list[str] = []
    for arg in (typing.get_args(ann) or (ann,)):
        if typing.get_origin(arg) is typing.Literal:
            lits += [str(a) for a in typing.get_args(arg)]
    return lits or None


class _Checker:
    """Validates keys and values against the recipe and the vocabularies."""

    def __init__(self, grid_file: str, lines: LineMap, base: Mapping[str, Any]) -> None:
        self.file, self.lines = grid_file, lines
        self.leaves = dict(recipes.flatten({k: v for k, v in base.items() if k not in SECTIONS}))

    def err(self, problem: str, path: tuple[Any, ...], **kw: Any) -> GridError:
        line = None
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                line = self.lines[path[:cut]]
                break
        return GridError(problem, file=self.file, line=line, key=format_path(path), **kw)

    def key(self, key: str, path: tuple[Any, ...]) -> None:
        section, _, field = key.partition(".")
        if section in SECTIONS:
            fields = list(SECTIONS[section].model_fields)
            if field not in fields:
                raise self.err(f"unknown key {key!r}", path, allowed=[f"{section}.{f}" for f in fields],
                               got=key)
            return
        if key not in self.leaves:
            allowed = sorted(self.leaves) + [f"{s}.{f}" for s, m in SECTIONS.items() for f in m.model_fields]
            raise self.err(f"unknown key {key!r}: not in the recipe", path, allowed=allowed, got=key,
                           fix="override a leaf key of the recipe (see `ablate plan --show-recipe`)")

    def value(self, key: str, value: Any, path: tuple[Any, ...]) -> Any:
        self.key(key, path)
        section, _, field = key.partition(".")
        if section in SECTIONS:
            model = SECTIONS[section]
            try:
                model.model_validate({field: value})
            except ValidationError as exc:
                allowed = _allowed_values(model, field)
                problem = f"{_short(value)} is not valid for {key}"
                if not allowed:
                    problem += f" ({exc.errors()[0]['msg']})"
                raise self.err(problem, path, allowed=allowed, got=value) from None
            return value
        default = self.leaves[key]
        if not _same_type(default, value):
            raise self.err(f"{_short(value)} has type {type(value).__name__}, expected "
                           f"{type(default).__name__} like the recipe default {_short(default)}",
                           path)
        return value


def _same_type(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    return isinstance(value, type(default))


def _build(spec: GridFile, file: str, lines: LineMap, base: dict[str, Any], root: str,
           catalog: PoolCatalog) -> GridSpec:
    chk = _Checker(file, lines, base)
    fixed = tuple(sorted((k, _freeze(chk.value(k, v, ("overrides", k))))
                         for k, v in spec.overrides.items()))
    axes = tuple(_axis(name, values, spec, chk, catalog) for name, values in spec.axes.items())
    _check_pools(spec, axes, chk, catalog)
    _check_conflicts(axes, chk)
    excludes = tuple(_exclude(i, rule, axes, spec, chk) for i, rule in enumerate(spec.exclude))
    includes = tuple(_include(i, rule, axes, spec, chk, catalog) for i, rule in enumerate(spec.include))
    if spec.search is not None:
        for key in spec.search.params:
            chk.key(key, ("search", "params", key))
    if spec.on_collapse is not None:
        act = spec.on_collapse.resume
        if act.pool is not None:
            catalog.get(act.pool, file=file, line=chk.lines.get(("on_collapse", "resume", "pool")),
                        key="on_collapse.resume.pool")
        for k, v in act.set.items():
            chk.value(k, v, ("on_collapse", "resume", "set", k))
    for pool in spec.budget.per_pool:
        catalog.get(pool, file=file, line=lines.get(("budget", "per_pool", pool)),
                    key=f"budget.per_pool.{pool}")
    return GridSpec(file=file, spec=spec, axes=axes, fixed=fixed, recipe_config=base,
                    recipe_digest=recipes.digest(base), recipes_root=root, pools=catalog,
                    excludes=excludes, includes=includes, lines=lines)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) and len(v) == 2
                                                  and isinstance(v[0], str) for v in value):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _axis(name: str, values: Any, spec: GridFile, chk: _Checker, catalog: PoolCatalog) -> Axis:
    path = ("axes", name)
    if name in RESERVED_AXES:
        raise chk.err(f"{name!r} cannot be an axis", path,
                      fix="use the top-level 'seeds:' / 'steps:' keys" if name in ("seed", "steps")
                      else "run one grid per backend/recipe")
    if not values:
        raise chk.err("axis has no values", path, fix="list at least one value or remove the axis")
    if name == "pool":
        if not isinstance(values, list):
            raise chk.err("the pool axis is a list of pool names", path)
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise chk.err(f"{_short(v)} is not a pool name", path + (i,), allowed=catalog.names())
            catalog.get(v, file=chk.file, line=chk.lines.get(path + (i,)), key=f"axes.pool[{i}]")
        _no_dupes(values, path, chk)
        return Axis(name, "pool", tuple(values), tuple(() for _ in values))
    if isinstance(values, dict):
        labels, overrides = [], []
        for label, bundle in values.items():
            items = []
            for k, v in (bundle or {}).items():
                items.append((k, _freeze(chk.value(k, v, path + (label, k)))))
            labels.append(label)
            overrides.append(tuple(sorted(items)))
        return Axis(name, "bundle", tuple(labels), tuple(overrides))
    chk.key(name, path)
    labels, overrides = [], []
    for i, v in enumerate(values):
        chk.value(name, v, path + (i,))
        labels.append(_label(v))
        overrides.append(((name, _freeze(v)),))
    _no_dupes(labels, path, chk)
    return Axis(name, "value", tuple(labels), tuple(overrides))


def _no_dupes(labels: Sequence[str], path: tuple[Any, ...], chk: _Checker) -> None:
    seen: set[str] = set()
    for i, label in enumerate(labels):
        if label in seen:
            raise chk.err(f"value {label!r} is listed twice", path + (i,), fix="remove the duplicate")
        seen.add(label)


def _check_pools(spec: GridFile, axes: Sequence[Axis], chk: _Checker, catalog: PoolCatalog) -> None:
    has_axis = any(a.kind == "pool" for a in axes)
    if spec.pool is None and not has_axis:
        raise chk.err("no pool: give a 'pool:' key or a 'pool' axis", ("axes",),
                      allowed=catalog.names(), fix="add e.g. 'pool: sim-h100'")
    if spec.pool is not None:
        if has_axis:
            raise chk.err("both 'pool:' and a 'pool' axis are set", ("pool",), fix="keep one")
        catalog.get(spec.pool, file=chk.file, line=chk.lines.get(("pool",)))
    names = [spec.pool] if spec.pool else next(a.labels for a in axes if a.kind == "pool")
    want = "sim" if spec.backend == "sim" else "gpu"
    for i, n in enumerate(names):
        if catalog.pools[n].kind != want:
            path = ("pool",) if spec.pool else ("axes", "pool", i)
            ok = [p for p in catalog.names() if catalog.pools[p].kind == want]
            raise chk.err(f"pool {n!r} is a {catalog.pools[n].kind} pool; backend "
                          f"{spec.backend!r} runs on {want} pools", path, allowed=ok)


def _check_conflicts(axes: Sequence[Axis], chk: _Checker) -> None:
    owner: dict[str, str] = {}
    for a in axes:
        keys = {k for ov in a.overrides for k, _ in ov}
        for k in sorted(keys):
            if k in owner:
                raise chk.err(f"key {k!r} is set by both axis {owner[k]!r} and axis {a.name!r}",
                              ("axes", a.name), fix="let one axis own each key")
            owner[k] = a.name


def _match_values(axis: Axis, value: Any, path: tuple[Any, ...], chk: _Checker) -> frozenset[int]:
    values = value if isinstance(value, list) and axis.kind != "value" else [value]
    if axis.kind == "value" and isinstance(value, list) and _label(value) not in axis.labels:
        values = value
    out = set()
    for v in values:
        label = _label(v)
        if label not in axis.labels:
            raise chk.err(f"{_short(v)} is not a value of axis {axis.name!r}", path,
                          allowed=list(axis.labels), got=label)
        out.add(axis.index_of(label))
    return frozenset(out)


def _exclude(i: int, rule: Mapping[str, Any], axes: Sequence[Axis], spec: GridFile,
             chk: _Checker) -> tuple[tuple[int, frozenset[int]], ...]:
    names = [a.name for a in axes]
    if not rule:
        raise chk.err("empty exclude rule would exclude every trial", ("exclude", i))
    out = []
    for key, value in rule.items():
        path = ("exclude", i, key)
        if key == "seed":
            seeds = value if isinstance(value, list) else [value]
            bad = [s for s in seeds if s not in spec.seeds]
            if bad:
                raise chk.err(f"seed {bad[0]!r} is not in seeds", path, allowed=spec.seeds)
            out.append((-1, frozenset(spec.seeds.index(s) for s in seeds)))
            continue
        if key not in names:
            raise chk.err(f"exclude names {key!r}, which is not an axis", path,
                          allowed=names + ["seed"], got=key)
        idx = names.index(key)
        out.append((idx, _match_values(axes[idx], value, path, chk)))
    return tuple(out)


def _include(i: int, rule: Mapping[str, Any], axes: Sequence[Axis], spec: GridFile, chk: _Checker,
             catalog: PoolCatalog) -> tuple[tuple[str, str], ...]:
    by_name = {a.name: a for a in axes}
    out = []
    for key, value in rule.items():
        path = ("include", i, key)
        if key == "seed":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise chk.err(f"{_short(value)} is not a seed", path)
            out.append((key, str(value)))
        elif key == "pool":
            if not isinstance(value, str):
                raise chk.err(f"{_short(value)} is not a pool name", path, allowed=catalog.names())
            catalog.get(value, file=chk.file, line=chk.lines.get(path), key=format_path(path))
            out.append((key, value))
        elif key in by_name and by_name[key].kind == "bundle":
            if value not in by_name[key].labels:
                raise chk.err(f"{_short(value)} is not a bundle of axis {key!r}", path,
                              allowed=list(by_name[key].labels), got=value)
            out.append((key, value))
        else:
            chk.value(key, value, path)
            out.append((key, json.dumps(value)))
    if "pool" not in dict(out) and spec.pool is None:
        raise chk.err("include entry needs a pool", ("include", i), fix="add 'pool: <name>'")
    return tuple(out)


# --------------------------------------------------------------------------- expansion


class _Resolver:
    """Turns merged overrides into normalised, hashable trial overrides (cached per section)."""

    def __init__(self, grid: GridSpec) -> None:
        self.grid = grid
        base = grid.recipe_config
        self.section_base = {s: dict(base[s]) for s in SECTIONS}
        self.leaves = dict(recipes.flatten({k: v for k, v in base.items() if k not in SECTIONS}))
        self.cache: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[tuple[str, Any], ...]] = {}
        self.backend_cls = _backend_class(grid.backend)
        self.checked: set[tuple[Any, ...]] = set()

    def section(self, name: str, items: tuple[tuple[str, Any], ...],
                context: str) -> tuple[tuple[str, Any], ...]:
        key = (name, items)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        model = SECTIONS[name]
        raw = {**self.section_base[name], **{k.split(".", 1)[1]: _thaw(v) for k, v in items}}
        try:
            obj = model.model_validate(raw)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise self.grid.error(f"invalid combination ({context}): {msg}", "axes",
                                  fix="add an 'exclude:' rule for it") from None
        if isinstance(obj, CorrectionSpec):
            obj = obj.canonical()
        out = tuple(sorted((f"{name}.{k}", _freeze(v)) for k, v in obj.non_default().items()))
        self.cache[key] = out
        return out

    def resolve(self, merged: dict[str, Any], pool: str, context: str) -> tuple[tuple[str, Any], ...]:
        by_section: dict[str, list[tuple[str, Any]]] = {s: [] for s in SECTIONS}
        rest = []
        for k, v in merged.items():
            sec = k.split(".", 1)[0]
            if sec in by_section:
                by_section[sec].append((k, v))
            elif self.leaves.get(k, _MISSING) != _thaw(v):
                rest.append((k, v))
        out = []
        for sec, items in by_section.items():
            out.extend(self.section(sec, tuple(sorted(items)), context))
        self._backend_check(out, pool, context)
        out.extend(rest)
        return tuple(sorted(out))

    def _backend_check(self, section_items: list[tuple[str, Any]], pool: str, context: str) -> None:
        key = (tuple(section_items), pool)
        if self.backend_cls is None or key in self.checked:
            return
        corr = CorrectionSpec.model_validate(
            {**self.section_base["correction"],
             **{k.split(".", 1)[1]: _thaw(v) for k, v in section_items if k.startswith("correction.")}})
        roll = RolloutSpec.model_validate(
            {**self.section_base["rollout"],
             **{k.split(".", 1)[1]: _thaw(v) for k, v in section_items if k.startswith("rollout.")}})
        problem = self.backend_cls.check(corr, roll, self.grid.pools.pools[pool])
        if problem:
            raise self.grid.error(f"backend {self.grid.backend!r} cannot run ({context}): {problem}",
                                  "axes", fix="exclude this combination or change the value")
        self.checked.add(key)


_MISSING = object()


def _backend_class(name: str) -> Any:
    from orchestrator.backends import backend_class

    return backend_class(name)


def _identity(grid: GridSpec, pool: str, seed: int, overrides: tuple[tuple[str, Any], ...]) -> dict:
    cls = _backend_class(grid.backend)
    return {
        "backend": grid.backend if grid.backend != "k8s" else "verl",
        "backend_version": getattr(cls, "version", "0"),
        "recipe": grid.spec.recipe,
        "recipe_digest": grid.recipe_digest,
        "pool": pool,
        "seed": seed,
        "steps": grid.spec.steps,
        "overrides": overrides,
    }


def expand(grid: GridSpec, *, force: bool = False, limit: int | None = None) -> list[TrialSpec]:
    """All trials of a grid: axes x seeds, minus excludes, plus includes, deduplicated."""
    spec = grid.spec
    cap = limit if limit is not None else spec.budget.max_trials
    if grid.upper_bound > cap and not force:
        raise grid.error(f"grid expands to up to {grid.upper_bound} trials, over the limit {cap}",
                         "budget", "max_trials",
                         fix="raise budget.max_trials, add excludes, or pass --force")
    resolver = _Resolver(grid)
    fixed = dict(grid.fixed)
    seen: dict[str, TrialSpec] = {}
    trials: list[TrialSpec] = []
    pool_idx = next((i for i, a in enumerate(grid.axes) if a.kind == "pool"), None)
    ranges = [range(len(a.labels)) for a in grid.axes]
    for combo in itertools.product(*ranges):
        if _excluded(combo, None, grid.excludes):
            continue
        merged = dict(fixed)
        for a, i in zip(grid.axes, combo):
            merged.update(a.overrides[i])
        pool = grid.axes[pool_idx].labels[combo[pool_idx]] if pool_idx is not None else spec.pool
        axes = tuple((a.name, a.labels[i]) for a, i in zip(grid.axes, combo))
        for s_idx, seed in enumerate(spec.seeds):
            if grid.excludes and _excluded(combo, s_idx, grid.excludes):
                continue
            _add(grid, resolver, merged, pool, seed, axes, seen, trials)
    for inc in grid.includes:
        _expand_include(grid, resolver, fixed, dict(inc), seen, trials)
    if not trials:
        raise grid.error("grid expands to zero trials (every combination is excluded)", "exclude",
                         fix="loosen the exclude rules")
    return trials


def _excluded(combo: tuple[int, ...], seed_idx: int | None,
              excludes: Sequence[tuple[tuple[int, frozenset[int]], ...]]) -> bool:
    for rule in excludes:
        hit = True
        for idx, allowed in rule:
            if idx == -1:
                if seed_idx is None or seed_idx not in allowed:
                    hit = False
                    break
            elif combo[idx] not in allowed:
                hit = False
                break
        if hit:
            return True
    return False


def _add(grid: GridSpec, resolver: _Resolver, merged: dict[str, Any], pool: str, seed: int,
         axes: tuple[tuple[str, str], ...], seen: dict[str, TrialSpec], trials: list[TrialSpec]) -> None:
    context = ", ".join(f"{k}={v}" for k, v in axes) or "fixed settings"
    overrides = resolver.resolve(merged, pool, context)
    tid = trial_id_for(_identity(grid, pool, seed, overrides))
    if tid in seen:
        return
    trial = TrialSpec(trial_id=tid, grid=grid.name, backend=grid.backend, recipe=grid.spec.recipe,
                      pool=pool, seed=seed, steps=grid.spec.steps, axes=axes, overrides=overrides)
    seen[tid] = trial
    trials.append(trial)


def _expand_include(grid: GridSpec, resolver: _Resolver, fixed: dict[str, Any],
                    inc: dict[str, str], seen: dict[str, TrialSpec], trials: list[TrialSpec]) -> None:
    by_name = {a.name: a for a in grid.axes}
    merged = dict(fixed)
    axes: list[tuple[str, str]] = []
    for key, label in inc.items():
        if key in ("seed", "pool"):
            continue
        if key in by_name and by_name[key].kind == "bundle":
            merged.update(by_name[key].overrides[by_name[key].index_of(label)])
            axes.append((key, label))
        else:
            value = json.loads(label)
            merged[key] = _freeze(value)
            axes.append((key, _label(value)))
    pool = inc.get("pool") or grid.spec.pool
    assert pool is not None
    axes.append(("pool", pool))
    seeds = [int(inc["seed"])] if "seed" in inc else grid.spec.seeds
    for seed in seeds:
        _add(grid, resolver, merged, pool, seed, tuple(axes), seen, trials)


def search_trial(grid: GridSpec, params: Mapping[str, Any], choices: Mapping[str, str],
                 seed: int) -> TrialSpec:
    """A trial for one point sampled by the search: axis labels in ``choices`` + ``params``."""
    resolver = _Resolver(grid)
    merged = dict(grid.fixed)
    axes = []
    pool = grid.spec.pool
    for a in grid.axes:
        label = choices.get(a.name, a.labels[0])
        merged.update(a.overrides[a.index_of(label)])
        axes.append((a.name, label))
        if a.kind == "pool":
            pool = label
    for k, v in params.items():
        merged[k] = v
        axes.append((k, _label(v)))
    assert pool is not None
    seen: dict[str, TrialSpec] = {}
    out: list[TrialSpec] = []
    _add(grid, resolver, merged, pool, seed, tuple(axes), seen, out)
    return out[0]


def derive_trial(grid: GridSpec, parent: TrialSpec, sets: Mapping[str, Any], *,
                 pool: str | None = None, from_step: int) -> TrialSpec:
    """A new trial from ``parent`` with ``sets`` applied (``ablate resume --set``), linked to it."""
    chk = _Checker(grid.file, {}, grid.recipe_config)
    merged = dict(parent.overrides)
    for k, v in sets.items():
        merged[k] = _freeze(chk.value(k, v, ("--set", k)))
    target = pool or parent.pool
    resolver = _Resolver(grid)
    overrides = resolver.resolve(merged, target, f"derived from {parent.trial_id}")
    identity = _identity(grid, target, parent.seed, overrides)
    identity["derived_from"] = [parent.trial_id, from_step]
    axes = tuple(parent.axes) + tuple((k, _label(v)) for k, v in sorted(sets.items()))
    return TrialSpec(trial_id=trial_id_for(identity), grid=grid.name, backend=grid.backend,
                     recipe=grid.spec.recipe, pool=target, seed=parent.seed, steps=parent.steps,
                     axes=axes, overrides=overrides, derived_from=(parent.trial_id, from_step))


def suggest_axis(name: str, grid: GridSpec) -> str | None:
    return did_you_mean(name, [a.name for a in grid.axes])
