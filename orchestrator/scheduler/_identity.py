"""A grid's identity: what a name in the workdir (and its MLflow experiment) stands for.

Two different grids submitted under one name would otherwise merge silently: one experiment
holding 20- and 30-step trials side by side, tables pooling them. The first submission records
the fields that define the grid's trials in ``<grid>/identity.json`` (backend, recipe and its
digest, steps, seeds, pools, axes, overrides, exclude/include, search) with the trial ids it
expanded to. A later submission under the same name runs when

* its fields are the same (a re-submit, which resumes), or
* it keeps every trial the grid had and only adds some (more seeds, more axis values, an
  include: the growth the README documents, since trial ids are content hashes); or
* ``--extend`` says to add its trials to the existing grid anyway;

and is refused otherwise with the differences and the two ways out (a new name, ``--extend``).
Budgets, retries, collapse rules and checkpoints do not define trials and may change freely.

The file also records the trial-id scheme (``trial.ID_SCHEME``). A grid recorded under an older
scheme holds ids the current code would not produce for the same trials (scheme 1 hashed a
pool's name, not its definition): resubmitting it would run every trial again beside the old
ones and ``ablate compare`` would pool both. It is refused with the one fix (a new name); its
records stay readable (``ablate status``, ``ablate compare``).
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import StateFileError, UserError
from orchestrator.schema import NAME_PATTERN
from orchestrator.store import (
    TrialPaths,
    atomic_write_json,
    corrupt_state_file,
    read_json,
    records,
    workspace,
)
from orchestrator.tracking import recorded_elsewhere
from orchestrator.trial import ID_SCHEME

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
    from orchestrator.trial import TrialSpec

IDENTITY = "identity.json"
FIELDS = ("backend", "recipe", "steps", "seeds", "pool", "pool_catalog", "axes", "overrides",
          "exclude", "include", "search")


def renamed(grid: GridSpec, name: str | None) -> GridSpec:
    """``grid`` under another name (``--name``): its own workdir directory and experiment."""
    if name is None or name == grid.name:
        return grid
    if not re.fullmatch(NAME_PATTERN, name):
        raise UserError(f"--name {name[:60]!r}: not a grid name; allowed: lower-case letters, "
                        "digits and '-', 1-40 characters, starting and ending with a letter or "
                        "digit (a DNS-style name)")
    return dataclasses.replace(grid, spec=grid.spec.model_copy(update={"name": name}))


def fields(grid: GridSpec) -> dict[str, Any]:
    """The trial-defining fields of a grid as JSON (the user's own spelling, for messages)."""
    data = grid.spec.model_dump(mode="json")
    out = {k: data.get(k) for k in FIELDS}
    out["recipe_digest"] = grid.recipe_digest
    # eval: part of the ids when set (only then, and its keys only where set: grids recorded
    # before it, or before the engine reference's keys, keep their identity)
    if grid.spec.eval.reference is not None:
        out["eval"] = {k: v for k, v in data["eval"].items() if v is not None}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if value is not None else "none"
    return text if len(text) <= 60 else text[:57] + "..."


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each field that differs (axes one by one)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "axes" and isinstance(a, dict) and isinstance(b, dict):
            for axis in sorted(set(a) | set(b)):
                if axis not in b:
                    out.append(f"axes.{axis}: removed")
                elif axis not in a:
                    out.append(f"axes.{axis}: added {_short(b[axis])}")
                elif a[axis] != b[axis]:
                    out.append(f"axes.{axis}: {_short(a[axis])} -> {_short(b[axis])}")
        elif key == "recipe_digest":
            if old.get("recipe") == new.get("recipe"):
                out.append("recipe: its contents changed")
        else:
            out.append(f"{key}: {_short(a)} -> {_short(b)}")
    return out


def as_submitted(grid: GridSpec, grid_dir: Path) -> GridSpec:
    """``grid`` as its trials were submitted: with the backend ``identity.json`` recorded where
    ``ablate submit --backend`` gave another than the file's (``seed_study.yaml --backend
    miles``), so ``ablate resume``, ``compare`` and ``evaluate`` plan, run and describe the
    trials that ran (their trainer, recipe and pools), not the file's default ones."""
    path = Path(grid_dir) / IDENTITY
    try:
        stored = read_json(path) if path.exists() else {}
    except StateFileError:  # said by what needs the record (resume's scheme check); compare reads on
        return grid
    backend = (stored.get("fields") or {}).get("backend") if isinstance(stored, dict) else None
    if not isinstance(backend, str) or backend == grid.backend:
        return grid
    # deferred: ablate status imports this module, and needs no grid schema
    from orchestrator.grid import load_grid

    return renamed(load_grid(grid.file, backend=backend), grid.name)


def check_scheme(grid: GridSpec, grid_dir: Path, stored: dict[str, Any] | None = None) -> None:
    """Refuse a grid whose workdir was recorded under an older trial-id scheme (one line, the
    fix: run it again under a new name; the old records stay readable)."""
    path = Path(grid_dir) / IDENTITY
    if stored is None and path.exists():
        stored = read_json(path)
    # Without identity.json (trials run by `ablate run-trial`, or before the file existed) the
    # trials' own specs tell: a spec written under scheme 2 has its config id.
    scheme = _stored_scheme(stored, path) if stored is not None else _specs_scheme(grid_dir)
    if scheme == ID_SCHEME:
        return
    if scheme > ID_SCHEME:
        raise UserError(
            f"{grid.file}: grid {grid.name!r} in {Path(grid_dir).parent} was recorded by a newer "
            f"rl-ablate (trial-id scheme {scheme}; this one knows up to {ID_SCHEME}), so this version "
            f"cannot tell which of its trials a grid means; fix: upgrade rl-ablate "
            f"(`ablate --version` says which one runs), or submit under a new name: "
            f"`ablate submit {grid.file} --name {_new_name(grid.name)}`")
    raise UserError(
        f"{grid.file}: grid {grid.name!r} in {Path(grid_dir).parent} was recorded with trial ids "
        f"of an older rl-ablate (id scheme {scheme}; ids now also cover each pool's definition, "
        f"see docs/trial-identity.md), so its trials cannot be continued or extended; its results "
        f"stay readable (`ablate status`, `ablate compare`); fix: run it again under a new name: "
        f"`ablate submit {grid.file} --name {_new_name(grid.name)}`")


def _stored_scheme(stored: Any, path: Path) -> int:
    """The id scheme identity.json records (1 before the field existed); a value that is not a
    positive whole number is a damaged file, refused in one line as ``read_json`` does."""
    if not isinstance(stored, dict):
        raise corrupt_state_file(path, "not a JSON object")
    scheme = stored.get("id_scheme", 1)
    if scheme is None:
        return 1
    if isinstance(scheme, bool) or not isinstance(scheme, int) or scheme < 1:
        raise corrupt_state_file(path, f"id_scheme is {scheme!r}, not a positive whole number")
    return scheme


def _specs_scheme(grid_dir: Path, sample: int = 20) -> int:
    """The id scheme of a grid's trial specs (a few are enough: one version wrote them all)."""
    for tid in records.trial_ids(grid_dir)[:sample]:
        if not read_json(TrialPaths(grid_dir, tid).spec).get("config"):
            return 1
    return ID_SCHEME


def _new_name(name: str) -> str:
    """A suggested name for the grid's rerun (within the 40 characters a grid name may have)."""
    return f"{name[:37].rstrip('-')}-v2"


def check_identity(grid: GridSpec, grid_dir: Path, trials: Sequence[TrialSpec], *,
                   extend: bool = False) -> str | None:
    """Refuse a grid that is not the one ``grid_dir`` holds (``UserError`` with the differences
    and the fix), else record it; returns a note when the grid grew (or was extended)."""
    path = Path(grid_dir) / IDENTITY
    new = fields(grid)
    ids = sorted(t.trial_id for t in trials)
    if not path.exists():
        atomic_write_json(path, {"fields": new, "trials": ids, "id_scheme": ID_SCHEME})
        return None
    stored = read_json(path)
    check_scheme(grid, grid_dir, stored)
    old, known = stored.get("fields") or {}, list(stored.get("trials") or [])
    if old == new:
        return None
    diff = differences(old, new)
    added = sorted(set(ids) - set(known))
    grows = grid.spec.search is None and set(known) <= set(ids)
    if not (grows or extend):
        raise UserError(
            f"{grid.file}: grid {grid.name!r} already ran in {grid_dir.parent} with other trials "
            f"({'; '.join(diff[:6])}{'; ...' if len(diff) > 6 else ''}); fix: submit it under a "
            f"new name (`--name NEW`, or `name:` in the file), or add its trials to the existing "
            f"grid with `--extend`"
            + ("; or score the checkpoints of the trials it ran with the reference evaluator: "
               f"`ablate evaluate {grid.file}`"
               if old.get("eval") != new.get("eval") else ""))
    atomic_write_json(path, {**stored, "fields": new, "trials": sorted(set(known) | set(ids)),
                             "id_scheme": ID_SCHEME})
    if grows and not added:
        return None  # the same trials, spelt differently (e.g. seeds in another order)
    how = "grows" if grows else "extended (--extend)"
    return f"grid {grid.name} {how}: {'; '.join(diff[:6])}; {len(added)} new trial(s)"


def store_note(grid: GridSpec, grid_dir: Path, trials: Sequence[TrialSpec],
               tracking_uri: str) -> str | None:
    """Record that the grid is tracked in ``tracking_uri`` (``workspace.canonical_uri``: a
    SQLite file by its absolute path, no credentials, in ``identity.json``), and say when
    finished trials, which a submission does not run again, have no run there: they were
    recorded in another store; ``ablate publish`` copies them. None when there is nothing to
    say."""
    shown_uri = workspace.canonical_uri(tracking_uri)
    path = Path(grid_dir) / IDENTITY
    if path.exists():
        stored = read_json(path)
        stores = list(stored.get("stores") or [])
        if shown_uri not in stores:
            atomic_write_json(path, {**stored, "stores": [*stores, shown_uri]})
    known = set(records.trial_ids(grid_dir)) if (Path(grid_dir) / "trials").is_dir() else set()
    finished = [t.trial_id for t in trials if t.trial_id in known
                and records.load_state(TrialPaths(grid_dir, t.trial_id), t.trial_id).state.is_finished()]
    missing = recorded_elsewhere(grid.name, tracking_uri, finished)
    if not missing:
        return None
    return (f"grid {grid.name}: {missing} finished trial(s) are not run again and have no run in "
            f"the tracking store {shown_uri} (they were recorded in {_elsewhere(stored_stores(grid_dir), shown_uri)}); "
            f"to see them there: `ablate publish {grid.file} --tracking-uri {shown_uri}`")


def stored_stores(grid_dir: Path) -> list[str]:
    """The tracking stores the grid was submitted to (``workspace.canonical_uri``; a record
    written before that form keeps what it holds), oldest first."""
    path = Path(grid_dir) / IDENTITY
    return list(read_json(path).get("stores") or []) if path.exists() else []


def _elsewhere(stores: Sequence[str], here: str) -> str:
    others = [s for s in stores if s != here]
    return ", ".join(others) if others else "another store"
