"""What a grid's probes cost (``<grid dir>/probes.json``): probe id -> its label, pool, unit,
accelerator-hours and runs. ``ablate probe`` and a submission's ``preflight:`` add to it
(``probe._run.record_spent``); ``ablate compare``'s cost table and the grid's budget
(``scheduler._budget``) read it, so an accelerator-hour spent on a probe is counted once, where
the grid's trials are."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.exceptions import StateFileError
from orchestrator.store._files import atomic_write_json, read_json

LEDGER = "probes.json"


def read(grid_dir: Path) -> dict[str, dict[str, Any]]:
    """The grid's probe ledger (empty where it has none); a damaged one raises ``StateFileError``
    (one line naming the file)."""
    path = Path(grid_dir) / LEDGER
    if not path.is_file():
        return {}
    data = read_json(path)
    probes = data.get("probes") if isinstance(data, dict) else None
    if not isinstance(probes, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("hours"), int | float)
            and isinstance(e.get("unit"), str) for e in probes.values()):
        raise StateFileError(f"{path}: not a probe ledger; fix: delete it (the next probe writes "
                             "it again)")
    return probes


def write(grid_dir: Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    atomic_write_json(Path(grid_dir) / LEDGER, {"probes": {k: dict(v) for k, v in entries.items()}})


def hours(entries: Mapping[str, Mapping[str, Any]], *, pool: str | None = None,
          unit: str | None = None) -> float:
    """Hours the ledger's probes spent (on ``pool``; in ``unit``: GPU- and CPU-hours never add)."""
    return sum(float(e["hours"]) for e in entries.values()
               if (pool is None or e.get("pool") == pool) and (unit is None or e["unit"] == unit))
