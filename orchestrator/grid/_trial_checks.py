"""Checks of each resolved trial, after the grid's own (``_validation``): a correction preset
beside a key the same trial sets (``preset_conflict``, asked by the resolver per section), and
what each trial hands its backend (``check_backend_args``, once per distinct configuration and
pool after expansion). Every command that expands a grid runs them, so none accepts what
another (``plan --show-overrides``, the job) would refuse.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import corrections
from orchestrator.backends import backend
from orchestrator.exceptions import GridError
from orchestrator.grid._schema_errors import short_value as _short
from orchestrator.grid._spec import GridSpec
from orchestrator.trial import TrialSpec, thaw


def check_backend_args(grid: GridSpec, trials: Sequence[TrialSpec]) -> None:
    """What each trial hands its trainer and launcher, built once per distinct configuration
    and pool, as ``plan --show-overrides`` and the job build it: every command that expands a
    grid refuses what the job would refuse (verl: the full override list with the pool's
    ``verl_overrides``; Slurm: the ``#SBATCH`` options). A refusal is told at the grid key it is
    about, or at the pool catalogue's key when the pool's settings cause it."""
    runs = backend(grid.backend)
    seen: set[tuple[str, str]] = set()
    for t in trials:
        if (t.config, t.pool) in seen:
            continue
        seen.add((t.config, t.pool))
        try:
            runs.describe(t, grid.trial_config(t))
        except GridError as exc:
            text = str(exc).removeprefix("<grid>: ")
            if text.startswith(f"pool {t.pool}: "):
                file, line = grid.pools.where(t.pool, "verl_overrides")
                raise GridError(text.removeprefix(f"pool {t.pool}: "), file=file, line=line,
                                key=f"pools.{t.pool}") from None
            key = text.split(": ", 1)[0]
            path = next((p for p in (("overrides", key), ("axes", key)) if p in grid.lines),
                        ("pool",) if grid.spec.pool else ("axes", "pool"))
            raise GridError(text, file=grid.file, line=grid.line(*path)) from None


def preset_conflict(section: str, base: Mapping[str, Any],
                    items: Sequence[tuple[str, Any]]) -> str | None:
    """A key the grid sets beside a ``correction.preset`` (the same trial's axis value, override
    or rescue ``set``) to anything but what the preset sets, or None. The section model cannot
    tell: the loader fills every default in, so a key set to its default beside a preset would
    be overwritten silently and the cell labelled by the value that did not run."""
    if section != "correction":
        return None
    given = {k.split(".", 1)[1]: thaw(v) for k, v in items}
    name = given.get("preset", base.get("preset"))
    if not isinstance(name, str) or name not in corrections.PRESETS:
        return None
    fields = corrections.preset_fields(name)
    for key, value in given.items():
        if key in fields and json.loads(json.dumps(value)) != fields[key]:
            return (f"correction.{key}: {_short(value)} conflicts with correction.preset: {name}, "
                    f"which sets {_short(fields[key])}; fix: drop one of them")
    return None
