"""Plan-time checks that what a grid asks for can be recorded as it claims.

* A cell is one configuration: axis and include names are MLflow params, stored under their
  sanitised key (``metrics.param_key``), so two names that give one key would share one param
  and ``ablate compare`` could not tell their trials apart: refused.
* A declared comparison (``compare:``) can be made: each value has at least one cell whose
  baseline cell exists (not removed by ``exclude:``, by value or by every seed) and is another
  configuration after resolution (``correction.is_mode`` compared while ``is_level: none``
  resolves both cells to one trial); ``compare:`` with ``search:`` is refused (a search's points
  differ in their searched values, so no two of them have "the other axes equal").
* A target can be recorded: the search objective is a metric the backend reports and is
  evaluated within ``steps``; adaptive seeds on ``collapse_rate`` have a rule that can give a
  ``collapsed`` verdict.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import metrics
from orchestrator.metrics import param_key

if TYPE_CHECKING:
    from orchestrator.grid._checker import Checker
    from orchestrator.grid._spec import Axis, GridSpec
    from orchestrator.schema import GridFile

RESERVED_PARAMS = ("pool", "seed", "steps")  # params every trial run has beside its axes
# A cell's resolved configuration (pool, overrides), or None when ``exclude:`` removed it.
CellConfigs = Mapping[tuple[tuple[str, str], ...], "tuple[str, tuple[tuple[str, Any], ...]] | None"]


def check_param_names(spec: GridFile, axes: Sequence[Axis], chk: Checker) -> None:
    """Axis and include names that MLflow would store under one param key are refused."""
    owners: dict[str, tuple[str, tuple[Any, ...]]] = {param_key(n): (n, ()) for n in RESERVED_PARAMS}
    places = [(a.name, ("axes", a.name)) for a in axes]
    places += [(k, ("include", i, k)) for i, rule in enumerate(spec.include) for k in rule]
    for name, path in places:
        key = param_key(name)
        other, _ = owners.setdefault(key, (name, path))
        if other != name:
            raise chk.err(f"{name!r} and {other!r} are both stored as the MLflow param {key!r}: "
                          "their trials could not be told apart", path,
                          fix="rename one (letters, digits, '_', '-', '.', '/', ' ' and ':' are "
                              "kept as written)")


def check_static(spec: GridFile, chk: Checker, fixed: Mapping[str, Any],
                 leaves: Mapping[str, Any], reported: Callable[[str], bool]) -> None:
    """The checks that need no expansion: compare with search, the targets (``reported``:
    whether some trial of the grid can report a metric, its trainer's answer)."""
    if spec.comparisons and spec.search is not None:
        raise chk.err("'compare:' cannot be combined with 'search:': the search's points differ "
                      "in their searched values, so no two have the other axes equal", ("compare",),
                      fix="drop 'compare:' (compare the search's best points in a grid of their own)")
    _check_objective(spec, chk, fixed, leaves, reported)
    _check_collapse_target(spec, chk)


def _check_objective(spec: GridFile, chk: Checker, fixed: Mapping[str, Any],
                     leaves: Mapping[str, Any], reported: Callable[[str], bool]) -> None:
    if spec.search is None:
        return
    path = ("search", "objective", "metric")
    name = spec.search.objective.metric
    base = name.removesuffix("/final")  # the value at the trial's last report
    if not reported(base):
        raise chk.err(f"no {spec.backend} trial ever reports metric {name!r}: every point would "
                      "score -collapse_penalty", path, got=base,
                      allowed=sorted(n + "/final" for n in metrics.vocabulary()),
                      fix="name a metric of orchestrator/metrics.py (optionally with '/final')")
    if base.startswith("eval/") and "eval.every" in leaves:
        every = fixed.get("eval.every", leaves["eval.every"])
        if isinstance(every, int) and (every <= 0 or every > spec.steps):
            raise chk.err(f"objective {name!r} is never evaluated: eval.every is {every} and a "
                          f"trial runs {spec.steps} steps, so every point would score "
                          "-collapse_penalty", path,
                          fix=f"set eval.every to at most {spec.steps} under overrides:, or use "
                              f"{metrics.TRAIN_REWARD}/final")


def _check_collapse_target(spec: GridFile, chk: Checker) -> None:
    ad = spec.adaptive
    if ad is None or ad.target != "collapse_rate":
        return
    col = spec.collapse
    if col.rules == "default":
        return
    rules = list(col.rules if isinstance(col.rules, list) else []) + list(col.extra_rules)
    if any(r.verdict == "collapsed" for r in rules):
        return
    why = ("it has no collapse rules" if not rules else
           "its rules can only give 'unstable' (" + ", ".join(r.name for r in rules) + ")")
    raise chk.err(f"collapse_rate is not recorded by this grid: {why}, so it would count NaN "
                  "failures only", ("seeds", "adaptive", "target"), allowed=["final_reward"],
                  got="collapse_rate",
                  fix="use target: final_reward, or add a rule with verdict: collapsed")


def watched_metrics(spec: GridFile) -> list[tuple[tuple[Any, ...], str]]:
    """(grid key path, metric) of every metric the grid itself names as a collapse rule, the
    early warning or the search objective (``/final`` stripped): each must be emitted by every
    trial, or the rule silently never fires / the point scores the collapse penalty there."""
    col = spec.collapse
    out: list[tuple[tuple[Any, ...], str]] = []
    for where in ("rules", "extra_rules"):
        rules = getattr(col, where)
        for i, rule in enumerate(rules if isinstance(rules, list) else []):
            out.append((("collapse", where, i, "metric"), rule.metric))
    warning = col.early_warning
    if warning is not None and not isinstance(warning, (bool, str)):
        out.append((("collapse", "early_warning", "metric"), warning.metric))
    if spec.search is not None:
        out.append((("search", "objective", "metric"),
                    spec.search.objective.metric.removesuffix("/final")))
    return out


def check_emitted(grid: GridSpec, unemitted: Mapping[str, str], context: str) -> None:
    """Refuse, in one line naming the grid key, the metric and why, a watched metric (a rule,
    the early warning, the objective) that the trial ``context`` will not emit (``unemitted``:
    its trainer's answer from the trial's whole configuration, ``Trainer.unemitted``)."""
    if not unemitted:
        return
    for path, name in watched_metrics(grid.spec):
        why = unemitted.get(name)
        if why is not None:
            raise grid.error(f"metric {name!r} is never emitted by the trials with {context}: "
                             f"{why}", *path, fix="watch a metric every trial emits, or exclude "
                             "those trials")


def check_comparisons(grid: GridSpec, cells: CellConfigs, label: Callable[[Any], str]) -> None:
    """Each value of a declared comparison has a cell comparable with its baseline cell
    (``label``: ``axis_label``, the one spelling of a value as a cell label)."""
    many = isinstance(grid.spec.compare, list)
    for i, decl in enumerate(grid.spec.comparisons):
        where = ("compare", i) if many else ("compare",)
        axis = next(a for a in grid.axes if a.name == decl.axis)
        base = label(decl.baseline)
        for value in axis.labels:
            if value == base:
                continue
            pairs = [(cfg, cells.get(_with(key, decl.axis, base)))
                     for key, cfg in cells.items() if dict(key).get(decl.axis) == value]
            if any(a is not None and b is not None and a != b for a, b in pairs):
                continue
            raise grid.error(_never(decl.axis, value, base, pairs), *where,
                             fix="exclude fewer combinations, drop the value from the axis, or "
                                 "compare another axis")


def _with(key: tuple[tuple[str, str], ...], axis: str, label: str) -> tuple[tuple[str, str], ...]:
    return tuple((a, label if a == axis else v) for a, v in key)


def _never(axis: str, value: str, base: str, pairs: Sequence[tuple[Any, Any]]) -> str:
    head = f"{axis}={value} can never be compared with the baseline {axis}={base}"
    if all(a is None for a, _ in pairs):
        return f"{head}: 'exclude:' removes every {axis}={value} cell"
    if all(b is None for a, b in pairs if a is not None):
        return f"{head}: 'exclude:' removes its baseline cell (by value or every seed)"
    return (f"{head}: both resolve to one configuration (the setting has no effect with the "
            "other values fixed, so their trials are the same)")
