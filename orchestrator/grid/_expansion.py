"""Grid expansion: axes x seeds, minus excludes, plus includes, deduplicated by content hash.

Overrides are normalised before hashing (correction fields that cannot matter are reset, values
equal to the recipe default are dropped), so configurations identical after resolution share
one trial id, whatever grid, key order or machine produced them.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from orchestrator import recipes
from orchestrator.backends import TrialConfig, backend
from orchestrator.corrections import CorrectionSpec
from orchestrator.exceptions import UserError
from orchestrator.grid._cells import check_comparisons, check_emitted, watched_metrics
from orchestrator.grid._checker import Checker
from orchestrator.grid._policy import pool_paths, set_keys
from orchestrator.grid._spec import SECTIONS, GridSpec, axis_label
from orchestrator.grid._trial_checks import check_backend_args, preset_conflict
from orchestrator.grid._validation import SUBMISSION_WIDE, split_index
from orchestrator.learner import (
    COMPANION_KEYS,
    LOSS_COMPANIONS,
    LOSS_SETTINGS,
    loss_companions,
)
from orchestrator.trial import (
    ID_SCHEME,
    TrialSpec,
    config_id,
    freeze,
    seeded_trial_ids,
    thaw,
    trial_id_for,
)


class _Resolver:
    """Turns merged overrides into normalised, hashable trial overrides (cached per section)."""

    def __init__(self, grid: GridSpec) -> None:
        self.grid = grid
        base = grid.recipe_config
        self.section_base = {s: dict(base[s]) for s in SECTIONS}
        self.leaves = dict(recipes.flatten({k: v for k, v in base.items() if k not in SECTIONS}))
        self.cache: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[tuple[str, Any], ...]] = {}
        self.backend = backend(grid.backend)
        self.checked: set[tuple[Any, ...]] = set()

    def section(self, name: str, items: tuple[tuple[str, Any], ...],
                context: Any) -> tuple[tuple[str, Any], ...]:
        key = (name, items)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        model = SECTIONS[name]
        conflict = preset_conflict(name, self.section_base[name], items)
        if conflict:
            raise self.grid.error(f"invalid combination ({_context(context)}): {conflict}", "axes")
        raw = {**self.section_base[name], **{k.split(".", 1)[1]: thaw(v) for k, v in items}}
        try:
            obj = model.model_validate(raw)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            own = None if "; fix: " in msg else "add an 'exclude:' rule for it"
            rescue = set_keys(self.grid.spec)
            mine = [rescue[k] for k, _ in items if k in rescue]
            if mine and str(context).startswith("derived from"):  # a rescue's value, not the axes'
                raise self.grid.error(f"{msg} ({_context(context)})", *mine[0],
                                      fix=None if own is None else "change the value") from None
            raise self.grid.error(f"invalid combination ({_context(context)}): {msg}", "axes",
                                  fix=own) from None
        if isinstance(obj, CorrectionSpec):
            obj = obj.canonical()
        out = tuple(sorted((f"{name}.{k}", freeze(v)) for k, v in obj.non_default().items()))
        self.cache[key] = out
        return out

    def resolve(self, merged: dict[str, Any], pool: str, context: Any) -> tuple[tuple[str, Any], ...]:
        merged = self._with_companions(merged)
        by_section: dict[str, list[tuple[str, Any]]] = {s: [] for s in SECTIONS}
        rest = []
        for k, v in merged.items():
            sec = k.split(".", 1)[0]
            if sec in by_section:
                by_section[sec].append((k, v))
            elif self.leaves.get(k, _MISSING) != thaw(v):
                rest.append((k, v))
        out = []
        for sec, items in by_section.items():
            out.extend(self.section(sec, tuple(sorted(items)), context))
        self._backend_check(out, pool, context)
        self._emitted_check(tuple(out), tuple(rest), pool, context)
        self._engine_check(out, tuple(rest), pool, context)
        # Also without overrides: the recipe's own values must run (once per pool). The learner
        # keys go with them: they constrain recipe values (verl separate_async's batch sizes).
        learner = [(k, v) for k, v in out if k.startswith("learner.")]
        self._value_check(tuple(rest + learner), pool, context)
        out.extend(rest)
        return tuple(sorted(out))

    def _with_companions(self, merged: dict[str, Any]) -> dict[str, Any]:
        """``merged`` plus the companion settings of its ``learner.loss`` (``learner.
        LOSS_COMPANIONS``: verl's example values for that loss) that neither the grid nor the
        recipe's ``learner:`` section sets. They become the trial's overrides: shown by ``plan
        --show-overrides``, recorded with the trial and hashed into its id, so a trial whose loss
        now runs at its own settings has a new id while every other id stays."""
        base = self.section_base["learner"]
        for key in LOSS_SETTINGS:  # one key, two spellings: which one would win is not obvious
            verl = [k for k in COMPANION_KEYS[key] if k.startswith("actor_rollout_ref.")]
            both = [k for k in verl if k in merged or f"+{k}" in merged]
            if (f"learner.{key}" in merged or base.get(key) is not None) and both:
                raise self.grid.error(f"learner.{key} and {both[0]} both set the loss's {key}",
                                      "overrides", fix=f"keep one of learner.{key} and {both[0]}")
        loss = thaw(merged["learner.loss"]) if "learner.loss" in merged else base.get("loss")
        given = {k.lstrip("+") for k in merged} | {f"learner.{k}" for k, v in base.items()
                                                   if v is not None}
        return {**merged, **loss_companions(loss, given)}

    def _value_check(self, items: tuple[tuple[str, Any], ...], pool: str, context: Any) -> None:
        """Recipe-leaf values a backend refuses (verl: '${' would become a live interpolation;
        sim: values its trainer would reject), and the whole config it refuses on that pool
        (verl: a model too large for a cpu pool), checked once per distinct set and pool."""
        if ("values", items, pool) in self.checked:  # apart from _backend_check's section keys
            return
        config = recipes.apply_overrides(self.grid.recipe_config, {k: thaw(v) for k, v in items})
        trial_config = TrialConfig.of(config, self.grid.pools.pools[pool])
        problem = self.backend.problem(trial_config, frozenset({"values"}), given=items)
        if problem:
            raise self.grid.error(f"backend {self.grid.backend!r} cannot run ({_context(context)}): "
                                  f"{problem}", *self._where(problem), fix="change the value")
        problem = self.backend.problem(trial_config, frozenset({"config"}))
        if problem:  # it names its own fix
            # The line of the grid key it is about if the grid sets it, else of the pool.
            grid_sets_it = any(k == problem.split(":", 1)[0] for k, _ in items)
            pool_key = ("pool",) if self.grid.spec.pool else ("axes", "pool")
            rescue_pool = pool_paths(self.grid.spec).get(pool)
            if rescue_pool is not None and str(context).startswith("derived from"):
                pool_key = rescue_pool  # a rescue's trial, on the pool its entry names
            where = self._where(problem) if grid_sets_it else pool_key
            raise self.grid.error(f"backend {self.grid.backend!r} cannot run ({_context(context)}): "
                                  f"{problem}", *where)
        self.checked.add(("values", items, pool))

    def _where(self, problem: str) -> tuple[str, ...]:
        """The grid key a backend's 'key: problem' message is about (for the line number)."""
        key = problem.split(":", 1)[0].strip()
        if any(a.name == key for a in self.grid.axes):
            return ("axes", key)
        if key in (self.grid.spec.overrides or {}):
            return ("overrides", key)
        rescue = set_keys(self.grid.spec)
        if key in rescue:
            return rescue[key]
        return ("overrides",)

    def _backend_check(self, section_items: list[tuple[str, Any]], pool: str, context: Any) -> None:
        key = (tuple(section_items), pool)
        if key in self.checked:
            return
        sections = {k: thaw(v) for k, v in section_items}
        config = TrialConfig.resolve(self.grid.recipe_config, sections, self.grid.pools.pools[pool])
        problem = self.backend.problem(config, frozenset({"combination"}))
        if problem:
            raise self.grid.error(f"backend {self.grid.backend!r} cannot run ({_context(context)}): "
                                  f"{problem}", "axes", fix=None if "; fix: " in problem
                                  else "exclude this combination or change the value")
        self.checked.add(key)

    def _emitted_check(self, sections: tuple[tuple[str, Any], ...], rest: tuple[tuple[str, Any], ...],
                       pool: str, context: Any) -> None:
        """The metrics the grid watches against those this trial will not emit, from its whole
        configuration (its sections and the recipe keys it sets: verl's evaluation)."""
        key = ("emitted", sections, rest, pool)
        if key in self.checked or not watched_metrics(self.grid.spec):
            return
        config = TrialConfig.resolve(self.grid.recipe_config,
                                     {k: thaw(v) for k, v in sections + rest},
                                     self.grid.pools.pools[pool])
        check_emitted(self.grid, self.backend.unemitted(config),
                      f"{_context(context)} on pool {pool}")
        self.checked.add(key)

    def _engine_check(self, sections: list[tuple[str, Any]], rest: tuple[tuple[str, Any], ...],
                      pool: str, context: Any) -> None:
        """Engine flags against the trial's engine, which may come from the recipe."""
        rollout_items = tuple(i for i in sections if i[0].startswith("rollout."))
        key = ("engine", rollout_items, rest, pool)
        if key in self.checked:
            return
        config = TrialConfig.resolve(self.grid.recipe_config,
                                     {k: thaw(v) for k, v in rest + rollout_items},
                                     self.grid.pools.pools[pool])
        problem = self.backend.problem(config, frozenset({"engine"}))
        if problem:
            raise self.grid.error(f"backend {self.grid.backend!r} cannot run ({_context(context)}): "
                                  f"{problem}", "axes", fix=None if "; fix: " in problem
                                  else "exclude this combination or change the value")
        self.checked.add(key)


_MISSING = object()


def _context(axes: Any) -> str:
    """Axis labels of the offending point, for error messages (built only on error)."""
    if isinstance(axes, str):
        return axes
    return ", ".join(f"{k}={v}" for k, v in axes) or "fixed settings"


def _identity(grid: GridSpec, pool: str, overrides: tuple[tuple[str, Any], ...]) -> dict:
    """What a trial's id hashes, but its seed: the resolved configuration, the backend's name
    and version (``Backend.identity``: k8s runs the same verl job as verl, so both give one
    id) and what the pool computes with (its definition, not only its name: a ``pool_catalog:``
    that redefines a pool, or an edited ``sim_profile``, gives new ids)."""
    return {
        "id_scheme": ID_SCHEME,
        **backend(grid.backend).identity(),
        "recipe": grid.spec.recipe,
        "recipe_digest": grid.recipe_digest,
        "pool": pool,
        "pool_def": grid.pools.identity(pool),
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
    cells: dict[tuple[tuple[str, str], ...], Any] = {}  # each cell's config, for compare:
    pool_idx = next((i for i, a in enumerate(grid.axes) if a.kind == "pool"), None)
    ranges = [range(len(a.labels)) for a in grid.axes]
    for combo in itertools.product(*ranges):
        axes = tuple((a.name, a.labels[i]) for a, i in zip(grid.axes, combo))
        if _excluded(combo, None, grid.excludes):
            cells[axes] = None
            continue
        merged = dict(fixed)
        for a, i in zip(grid.axes, combo):
            merged.update(a.overrides[i])
        pool = grid.axes[pool_idx].labels[combo[pool_idx]] if pool_idx is not None else spec.pool
        seeds = [s for i, s in enumerate(spec.seed_values)
                 if not (grid.excludes and _excluded(combo, i, grid.excludes))]
        cells[axes] = _add(grid, resolver, merged, pool, seeds, axes, seen, trials)
    for inc in grid.includes:
        _expand_include(grid, resolver, fixed, dict(inc), seen, trials)
    if not trials:
        raise grid.error("grid expands to zero trials (every combination is excluded)", "exclude",
                         fix="loosen the exclude rules")
    if spec.comparisons:
        check_comparisons(grid, cells, axis_label)
    _check_rescue(grid, trials)
    check_backend_args(grid, trials)
    return trials


def _check_rescue(grid: GridSpec, trials: Sequence[TrialSpec]) -> None:
    """A rescue entry's ``resume: {set: ...}`` derives trials only when its event happens:
    derive one now per pool (nothing is written) so a value the backend refuses fails at plan
    time."""
    firsts = {t.pool: t for t in reversed(trials)}
    for entry in grid.spec.rescue_policy:
        act = entry.resume
        if not act.set and act.pool is None:
            continue
        for t in firsts.values():
            derive_trial(grid, t, act.set, pool=act.pool or t.pool, from_step=0)


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


def _add(grid: GridSpec, resolver: _Resolver, merged: dict[str, Any], pool: str,
         seeds: Sequence[int], axes: tuple[tuple[str, str], ...], seen: dict[str, TrialSpec],
         trials: list[TrialSpec]) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """Resolve one grid point once, then add a trial per seed (only the seed changes the id);
    returns the point's resolved configuration (None when every seed is excluded)."""
    if not seeds:
        return None
    overrides = resolver.resolve(merged, pool, axes)
    identity = _identity(grid, pool, overrides)
    config = config_id(identity)
    for seed, tid in seeded_trial_ids(identity, seeds):
        if tid in seen:
            continue
        trial = TrialSpec(trial_id=tid, grid=grid.name, backend=grid.backend,
                          recipe=grid.spec.recipe, pool=pool, seed=seed, steps=grid.spec.steps,
                          axes=axes, overrides=overrides, config=config)
        seen[tid] = trial
        trials.append(trial)
    return pool, overrides


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
            merged[key] = freeze(value)
            axes.append((key, axis_label(value)))
    pool = inc.get("pool") or grid.spec.pool
    assert pool is not None
    axes.append(("pool", pool))
    seeds = [int(inc["seed"])] if "seed" in inc else grid.spec.seed_values
    _add(grid, resolver, merged, pool, seeds, tuple(axes), seen, trials)


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
        name, index = split_index(k)
        if index is None:
            merged[k] = v
        else:  # one element of a list value (an IS/RS bound); validated at plan time
            section, _, field = name.partition(".")
            current = merged.get(name, resolver.section_base[section].get(field) if section in SECTIONS
                                 else resolver.leaves.get(name))
            merged[name] = tuple(v if i == index else e for i, e in enumerate(current))
        axes.append((k, axis_label(v)))
    assert pool is not None
    seen: dict[str, TrialSpec] = {}
    out: list[TrialSpec] = []
    _add(grid, resolver, merged, pool, [seed], tuple(axes), seen, out)
    return out[0]


def derive_trial(grid: GridSpec, parent: TrialSpec, sets: Mapping[str, Any], *,
                 pool: str | None = None, from_step: int) -> TrialSpec:
    """A new trial from ``parent`` with ``sets`` applied (``ablate resume --set``), linked to it."""
    chk = Checker(grid.file, {}, grid.recipe_config)
    merged = dict(parent.overrides)
    if "learner.loss" in sets:  # the parent's loss companions go with its loss
        old = LOSS_COMPANIONS.get(thaw(merged.get("learner.loss")) or "", {})
        for key, value in old.items():
            if f"learner.{key}" not in sets and thaw(merged.get(f"learner.{key}")) == value:
                merged.pop(f"learner.{key}")
    for k, v in sets.items():
        if k in SUBMISSION_WIDE:  # as in a grid's axes: it may not differ between trials
            raise UserError(f"--set {k}: {k} cannot vary between trials: {SUBMISSION_WIDE[k]}; "
                            "fix: set it once under 'overrides:' of the grid and submit it under "
                            "a new name")
        merged[k] = freeze(chk.value(k, v, ("--set", k)))
    target = pool or parent.pool
    resolver = _Resolver(grid)
    overrides = resolver.resolve(merged, target, f"derived from {parent.trial_id}")
    identity = {**_identity(grid, target, overrides), "seed": parent.seed,
                "derived_from": [parent.trial_id, from_step]}
    axes = tuple(parent.axes) + tuple((k, axis_label(v)) for k, v in sorted(sets.items()))
    return TrialSpec(trial_id=trial_id_for(identity), grid=grid.name, backend=grid.backend,
                     recipe=grid.spec.recipe, pool=target, seed=parent.seed, steps=parent.steps,
                     axes=axes, overrides=overrides, derived_from=(parent.trial_id, from_step),
                     config=config_id(identity))
