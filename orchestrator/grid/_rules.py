"""A grid's ``exclude:`` and ``include:`` rules against its axes: an exclude rule as the axis
value indices it matches (``exclude_rule``; ``trainer:`` scopes one to a trainer's trials), an
include entry as its labels (``include_rule``)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.backends import trainer_names
from orchestrator.grid._checker import Checker
from orchestrator.grid._schema_errors import short_value as _short
from orchestrator.grid._spec import Axis, axis_label
from orchestrator.pools import PoolCatalog
from orchestrator.safeyaml import format_path
from orchestrator.schema import GridFile


def _match_values(axis: Axis, value: Any, path: tuple[Any, ...], chk: Checker) -> frozenset[int]:
    values = value if isinstance(value, list) and axis.kind != "value" else [value]
    if axis.kind == "value" and isinstance(value, list) and axis_label(value) not in axis.labels:
        values = value
    out = set()
    for v in values:
        label = axis_label(v)
        if label not in axis.labels:
            raise chk.err(f"{_short(v)} is not a value of axis {axis.name!r}", path,
                          allowed=list(axis.labels), got=label)
        out.add(axis.index_of(label))
    return frozenset(out)


def exclude_rule(i: int, rule: Mapping[str, Any], axes: Sequence[Axis], spec: GridFile,
             chk: Checker, trainer_of: Callable[[str], str],
             ) -> tuple[tuple[int, frozenset[int]], ...]:
    """One rule as (axis index, matching value indices) pairs, all of which must hold (-1: the
    seed's index). ``trainer:`` scopes a rule to the trials one trainer runs (what one trainer
    cannot express, in a grid that runs on either): as the pools that trainer runs."""
    names = [a.name for a in axes]
    if not rule:
        raise chk.err("empty exclude rule would exclude every trial", ("exclude", i))
    out = []
    for key, value in rule.items():
        path = ("exclude", i, key)
        if key == "trainer" and key not in names:  # a bundle axis may have that name
            wanted = value if isinstance(value, list) else [value]
            for name in wanted:
                if name not in trainer_names():
                    raise chk.err(f"{_short(name)} is not a trainer", path,
                                  allowed=trainer_names(), got=name)
            pool_axis = next((j for j, a in enumerate(axes) if a.kind == "pool"), None)
            labels = axes[pool_axis].labels if pool_axis is not None else (spec.pool,)
            hit = frozenset(j for j, p in enumerate(labels) if trainer_of(str(p)) in wanted)
            if pool_axis is not None:
                out.append((pool_axis, hit))
            elif not hit:  # another trainer's rule: it matches no trial here
                out.append((-1, frozenset()))
            continue
        if key == "seed":
            seeds = value if isinstance(value, list) else [value]
            bad = [s for s in seeds if s not in spec.seed_values]
            if bad:
                raise chk.err(f"seed {bad[0]!r} is not in seeds", path, allowed=spec.seed_values)
            out.append((-1, frozenset(spec.seed_values.index(s) for s in seeds)))
            continue
        if key not in names:
            raise chk.err(f"exclude names {key!r}, which is not an axis", path,
                          allowed=names + ["seed", "trainer"], got=key)
        idx = names.index(key)
        out.append((idx, _match_values(axes[idx], value, path, chk)))
    return tuple(out)


def include_rule(i: int, rule: Mapping[str, Any], axes: Sequence[Axis], spec: GridFile, chk: Checker,
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

