"""Grid validation: the semantic checks, after the schema check (``_schema_errors``).

Axis keys are checked against the composed recipe and the correction/engine vocabularies,
axis values against their types and allowed values, pools against the catalogue, excludes and
includes against the axes. Every problem is a one-line ``GridError`` with file:line, key path,
bad value, allowed values and a did-you-mean.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import evaluation, metrics, recipes
from orchestrator.backends import Backend, TrialConfig, backend
from orchestrator.exceptions import GridError
from orchestrator.grid._adaptive import check_cost_keys
from orchestrator.grid._cells import check_param_names, check_static
from orchestrator.grid._checker import Checker
from orchestrator.grid._policy import check_policy, set_keys
from orchestrator.grid._rules import exclude_rule, include_rule
from orchestrator.grid._schema_errors import short_value as _short
from orchestrator.grid._spec import SECTIONS, Axis, axis_label
from orchestrator.pools import PoolCatalog, PoolSpec
from orchestrator.safeyaml import LineMap
from orchestrator.schema import GridFile, SearchParam
from orchestrator.trial import freeze

RESERVED_AXES = ("seed", "steps", "backend", "recipe")


def split_index(key: str) -> tuple[str, int | None]:
    """A searched key: ``"a.b[1]"`` -> ``("a.b", 1)``; ``"a.b"`` -> ``("a.b", None)``."""
    if key.endswith("]") and "[" in key:
        name, _, index = key[:-1].rpartition("[")
        return name, int(index)
    return key, None


def _search_param(key: str, param: SearchParam, chk: Checker, fixed: Mapping[str, Any],
                  base: Mapping[str, Any]) -> None:
    """A searched key is a leaf, or element ``[i]`` of a list value (an IS or RS bound): that
    list must exist (in ``overrides:`` or the recipe) and stay valid at both ends of the range."""
    path = ("search", "params", key)
    name, index = split_index(key)
    chk.key(name, path)
    if index is None:
        return
    section, _, field = name.partition(".")
    current = fixed.get(name, base[section].get(field) if section in SECTIONS else chk.leaves.get(name))
    if not isinstance(current, (list, tuple)) or index >= len(current):
        raise chk.err(f"{key}: {name} is {_short(current)}, which has no element {index}", path,
                      fix=f"give {name} a list value under overrides: (e.g. [null, 2.0]) to search one of its elements")
    for end in (param.low, param.high):
        value = list(current)
        value[index] = int(end) if param.kind == "int" else float(end)
        chk.value(name, value, path)
        if section in SECTIONS:  # cross-field rules too (an upper bound below the lower one)
            raw = {**base[section], **{k.partition(".")[2]: v for k, v in fixed.items()
                                       if k.partition(".")[0] == section}, field: value}
            try:
                SECTIONS[section].model_validate(raw)
            except ValidationError as exc:
                msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
                raise chk.err(f"search range [{param.low}, {param.high}] of {key}: at {end}, {msg}",
                              path, got=value) from None


def build(spec: GridFile, file: str, lines: LineMap, base: dict[str, Any], root: str,
          catalog: PoolCatalog) -> dict[str, Any]:
    """Semantic checks of a schema-valid grid; returns the fields of its ``GridSpec``."""
    chk = Checker(file, lines, base)
    _no_reference_override(spec, chk)
    fixed = tuple(sorted((k, freeze(chk.value(k, v, ("overrides", k))))
                         for k, v in spec.overrides.items()))
    axes = tuple(_axis(name, values, spec, chk, catalog) for name, values in spec.axes.items())
    runs = backend(spec.backend)
    pools = _check_pools(spec, axes, chk, catalog, runs)
    _check_conflicts(axes, chk)
    _check_submission_wide(spec, axes, chk)
    _check_metrics(spec, chk, runs, pools)
    _check_store(spec, chk, runs)
    excludes = tuple(exclude_rule(i, rule, axes, spec, chk,
                                  lambda pool: runs.trainer(catalog.pools[pool]).name)
                     for i, rule in enumerate(spec.exclude))
    includes = tuple(include_rule(i, rule, axes, spec, chk, catalog)
                     for i, rule in enumerate(spec.include))
    if spec.search is not None:
        for key, param in spec.search.params.items():
            _search_param(key, param, chk, dict(fixed), base)
    check_policy(spec, chk, catalog, runs)
    for pool in spec.budget.per_pool:
        catalog.get(pool, file=file, line=lines.get(("budget", "per_pool", pool)),
                    key=f"budget.per_pool.{pool}")
    fixed = _with_reference(spec, chk, runs, pools, fixed, catalog, base)
    check_cost_keys(spec, axes, chk, catalog, axis_label)
    check_param_names(spec, axes, chk)
    check_static(spec, chk, dict(fixed), chk.leaves, lambda name: runs.reported(name, pools))
    return {"file": file, "spec": spec, "axes": axes, "fixed": fixed, "recipe_config": base,
            "recipe_digest": recipes.digest(base), "recipes_root": root, "pools": catalog,
            "excludes": excludes, "includes": includes, "lines": lines}


def _arm_key_paths(spec: GridFile) -> list[tuple[Any, ...]]:
    """Where the grid sets keys per arm: each axis, each key of an axis's bundles, each key of
    an include and of a rescue's ``set``."""
    places: list[tuple[Any, ...]] = []
    for name, values in spec.axes.items():
        places.append(("axes", name))
        if isinstance(values, dict):
            places += [("axes", name, label, k) for label, ov in values.items() for k in ov or {}]
    places += [("include", i, k) for i, rule in enumerate(spec.include) for k in rule]
    if spec.on_collapse is not None:
        places += [("on_collapse", "resume", "set", k) for k in spec.on_collapse.resume.set]
    return places


def _no_reference_override(spec: GridFile, chk: Checker) -> None:
    """``eval.reference`` (and the engine reference's ``eval.pool``, ``eval.rollout``) is set
    only by the grid key ``eval:``: one evaluator for every arm, so never an axis, an include,
    an override or a rescue's ``set``."""
    for path in [("overrides", k) for k in spec.overrides] + _arm_key_paths(spec):
        if path[-1] in evaluation.GRID_KEYS:
            raise chk.err(f"{path[-1]} is set by the grid key 'eval:', one evaluator for every "
                          "trial", path, fix="write 'eval: {reference: trainer}' (or "
                          "reference: engine with its pool) at the top of the grid")


def _with_reference(spec: GridFile, chk: Checker, runs: Backend, pools: Sequence[PoolSpec],
                    fixed: tuple[tuple[str, Any], ...], catalog: PoolCatalog,
                    base: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``eval: {reference: ...}`` (``orchestrator/evaluation.py``): every pool's trainer must
    run that evaluator, and ``engine``'s job its pool and engine settings; the keys become the
    fixed overrides ``eval.*``, so they are part of the trials' ids when set and absent from
    them otherwise."""
    ev = spec.eval
    target = ev.reference
    job_keys = [k for k in ("pool", "rollout") if getattr(ev, k) is not None]
    if target != "engine" and job_keys:
        raise chk.err(f"this key sets up the engine reference's job, and the grid's reference "
                      f"is {target or 'not set'}", ("eval", job_keys[0]),
                      fix=f"set 'reference: engine', or drop eval.{job_keys[0]}")
    if target is None:
        return fixed
    for pool in pools:
        problem = runs.evaluator(pool).problem(target, pool)
        if problem:
            raise chk.err(problem.removeprefix(f"{evaluation.OVERRIDE_KEY}: "),
                          ("eval", "reference"),
                          fix=None if "; fix: " in problem else "drop eval.reference")
    extra: list[tuple[str, Any]] = [(evaluation.OVERRIDE_KEY, target)]
    if target == "engine":
        if ev.pool is None:
            raise chk.err("the engine reference scores every arm's checkpoints on one named "
                          "pool, and eval.pool is not set", ("eval", "reference"),
                          fix="add 'pool: <a cpu or gpu pool>' under eval:")
        if ev.pool not in catalog.pools:
            raise chk.err(f"unknown pool {ev.pool!r}", ("eval", "pool"), allowed=catalog.names(),
                          got=ev.pool, fix=f"use a pool from {catalog.source}")
        pool = catalog.pools[ev.pool]
        for key, value in (ev.rollout or {}).items():
            chk.value(f"rollout.{key}", value, ("eval", "rollout", key))
        try:
            rollout = SECTIONS["rollout"].model_validate(dict(ev.rollout or {}))
        except ValidationError as exc:
            raise chk.err(exc.errors()[0]["msg"].removeprefix("Value error, "),
                          ("eval", "rollout")) from None
        arm_keys = sorted({str(path[-1]) for path in _arm_key_paths(spec)})
        problem = runs.evaluator(pool).job_problem(target, pool, rollout, base, arm_keys, pools)
        if problem:
            raise chk.err(problem, ("eval", "rollout" if ev.rollout else "pool"),
                          fix=None if "; fix: " in problem else "pick another eval.pool")
        extra.append((evaluation.POOL_KEY, pool.name))
        if ev.rollout:
            extra.append((evaluation.ROLLOUT_KEY, freeze(rollout.model_dump(exclude_none=True))))
    return tuple(sorted((*fixed, *extra)))


# What a terminal acts on: ESC (it starts the ANSI / OSC sequences that retitle a window, move
# the cursor or hide text), BEL, backspace, the other C0 controls, DEL and the C1 controls (CSI
# and OSC in one byte). Tab, newline and CR are kept: names and values are free text that the
# tables and the one-line errors show with their whitespace joined.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _printable(text: str, path: tuple[Any, ...], chk: Checker, what: str) -> None:
    """A name the grid defines (an axis, a bundle, a string axis value: every one becomes a
    label in tables, terminals, MLflow and trials.csv) holds no terminal control character."""
    if _CONTROL.search(text):
        raise chk.err(f"{what} {ascii(text)[:80]} holds a control character (shown escaped), "
                      "which would reach terminals, logs and tables raw", path,
                      fix="rename it with printable characters")


def _axis(name: str, values: Any, spec: GridFile, chk: Checker, catalog: PoolCatalog) -> Axis:
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
        _printable(name, path, chk, "axis name")  # a value axis's name is a known key
        labels, overrides = [], []
        for label, bundle in values.items():
            _printable(label, path + (label,), chk, "bundle name")
            items = []
            for k, v in (bundle or {}).items():
                items.append((k, freeze(chk.value(k, v, path + (label, k)))))
            labels.append(label)
            overrides.append(tuple(sorted(items)))
        return Axis(name, "bundle", tuple(labels), tuple(overrides))
    chk.key(name, path)
    labels, overrides = [], []
    for i, v in enumerate(values):
        _printable(axis_label(v), path + (i,), chk, "axis value")
        chk.value(name, v, path + (i,))
        labels.append(axis_label(v))
        overrides.append(((name, freeze(v)),))
    _no_dupes(labels, path, chk)
    return Axis(name, "value", tuple(labels), tuple(overrides))


# Keys that set how the worker processes start (their environment), so one value holds for a
# whole submission: they may be fixed under ``overrides:``, never vary between trials.
SUBMISSION_WIDE = {"sim.reproducible": "it pins the numerics of the processes that run the trials"}


def _check_submission_wide(spec: GridFile, axes: Sequence[Axis], chk: Checker) -> None:
    places = [(("axes", a.name) + ((label,) if a.kind == "bundle" else ()), key)
              for a in axes for label, ov in zip(a.labels, a.overrides) for key, _ in ov]
    places += [(("include", i), key) for i, rule in enumerate(spec.include) for key in rule]
    # A rescue's derived trial would differ from its parent.
    places += [(path, key) for key, path in set_keys(spec).items()]
    for path, key in places:
        if key in SUBMISSION_WIDE:
            raise chk.err(f"{key} cannot vary between trials: {SUBMISSION_WIDE[key]}", path,
                          fix="set it once under 'overrides:' (or submit two grids)")


def _check_metrics(spec: GridFile, chk: Checker, runs: Backend, pools: list[PoolSpec]) -> None:
    """Collapse and early-warning rules watch metrics the trainers of the grid's pools report
    from ``min_step`` on; a rule on a name none of them reports, or starting after the last
    step, can never fire (a typo would silently switch the rule off)."""
    col = spec.collapse
    rules = [("rules", i, r) for i, r in enumerate(col.rules if isinstance(col.rules, list) else [])]
    rules += [("extra_rules", i, r) for i, r in enumerate(col.extra_rules)]
    watched = [(("collapse", where, i), r.metric, r.min_step) for where, i, r in rules]
    if isinstance(col.early_warning, BaseModel):
        watched.append((("collapse", "early_warning"), col.early_warning.metric,
                        col.early_warning.min_step))
    for where, name, min_step in watched:
        if min_step > spec.steps:
            raise chk.err(f"min_step {min_step} is after the last step (steps: {spec.steps}): the "
                          "rule could never fire", (*where, "min_step"),
                          fix=f"set min_step to at most {spec.steps}")
        path = (*where, "metric")
        if not runs.reported(name, pools):
            raise chk.err(f"no {spec.backend} trial ever reports metric {_short(name)}: the rule "
                          "could never fire", path, allowed=sorted(metrics.vocabulary()), got=name,
                          fix="name a metric of orchestrator/metrics.py")


def _check_store(spec: GridFile, chk: Checker, runs: Backend) -> None:
    """``checkpoint.store``: an fsspec URL whose scheme exists (and, where trials run on this
    machine, whose package is installed), or a local directory this process can write."""
    store = spec.checkpoint.store
    if store is None:
        return
    path = ("checkpoint", "store")
    scheme, sep, rest = store.partition("://")
    if sep and scheme != "file":
        # deferred: fsspec (0.3 s) only for a grid that names a URL store
        from fsspec.registry import get_filesystem_class, known_implementations, registry
        known = sorted(set(known_implementations) | set(registry))
        if scheme not in known:
            raise chk.err(f"{_short(store)}: unknown URL scheme {scheme!r}", path,
                          allowed=known, got=scheme, fix="use a local path or an fsspec URL")
        if runs.stores_here:  # k8s trials reach the store from the cluster, not from here
            try:
                get_filesystem_class(scheme)
            except ImportError as exc:
                raise chk.err(f"{_short(store)}: {scheme}:// needs a package this environment "
                              f"lacks ({exc})", path, fix="install it or use a local path") from None
        return
    if not runs.stores_here:
        return
    problem = _unwritable(os.path.expanduser(rest if sep else store))
    if problem:
        raise chk.err(f"{_short(store)}: {problem}", path,
                      fix="name a directory this user can write, or an fsspec URL")


def _unwritable(target: str) -> str | None:
    """Why checkpoints cannot be written under ``target`` (created on first use), or None."""
    here = os.path.abspath(target)
    while not os.path.lexists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        return f"{here} is not a directory"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"{here} is not writable by this user"
    st = os.statvfs(here)
    if st.f_flag & os.ST_RDONLY:
        return f"{here} is on a read-only file system"
    if st.f_blocks == 0:
        return f"{here} is on a virtual file system that stores no files"
    return None


def _no_dupes(labels: Sequence[str], path: tuple[Any, ...], chk: Checker) -> None:
    seen: set[str] = set()
    for i, label in enumerate(labels):
        if label in seen:
            raise chk.err(f"value {label!r} is listed twice", path + (i,), fix="remove the duplicate")
        seen.add(label)


def _check_pools(spec: GridFile, axes: Sequence[Axis], chk: Checker, catalog: PoolCatalog,
                 runs: Backend) -> list[PoolSpec]:
    """The pools the grid's trials run on, each of a kind its backend runs."""
    has_axis = any(a.kind == "pool" for a in axes)
    if spec.pool is None and not has_axis:
        raise chk.err("no pool: give a 'pool:' key or a 'pool' axis", ("axes",),
                      allowed=catalog.names(), fix="add e.g. 'pool: sim-h100'")
    if spec.pool is not None:
        if has_axis:
            raise chk.err("both 'pool:' and a 'pool' axis are set", ("pool",), fix="keep one")
        catalog.get(spec.pool, file=chk.file, line=chk.lines.get(("pool",)))
    names = [spec.pool] if spec.pool else next(a.labels for a in axes if a.kind == "pool")
    want = runs.pool_kinds
    for i, n in enumerate(names):
        if catalog.pools[n].kind not in want:
            path = ("pool",) if spec.pool else ("axes", "pool", i)
            ok = [p for p in catalog.names() if catalog.pools[p].kind in want]
            raise chk.err(f"pool {n!r} is a {catalog.pools[n].kind} pool; backend "
                          f"{spec.backend!r} runs on {' and '.join(want)} pools", path, allowed=ok)
        check_catalog_pool(runs, catalog, n)
    return [catalog.pools[n] for n in names]


def check_catalog_pool(backend: Backend, catalog: PoolCatalog, name: str) -> None:
    """A pool's own settings, refused at the catalogue's file and key (a typo in a
    ``sim_profile`` is the catalogue's mistake, not the grid's axes)."""
    found = backend.problems(TrialConfig.of({}, catalog.pools[name]), stages=frozenset({"pool"}))
    if found:
        key, why = found[0].key or "", found[0].reason
        file, line = catalog.where(name, key)
        own_fix = "; fix: " in why  # the trainer's or launcher's reason names its own fix
        raise GridError(why.removeprefix(f"pool {name}: "), file=file, line=line,
                        key=f"pools.{name}", fix=None if own_fix else "correct it in the pool catalogue")


def _check_conflicts(axes: Sequence[Axis], chk: Checker) -> None:
    owner: dict[str, str] = {}
    for a in axes:
        keys = {k for ov in a.overrides for k, _ in ov}
        for k in sorted(keys):
            if k in owner:
                raise chk.err(f"key {k!r} is set by both axis {owner[k]!r} and axis {a.name!r}",
                              ("axes", a.name), fix="let one axis own each key")
            owner[k] = a.name
