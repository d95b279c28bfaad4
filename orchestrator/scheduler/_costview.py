"""Cost in ``ablate status``: per trial (a column of the trial table), per cell (the trials of
one configuration, seeds summed) and per grid, in each pool unit (GPU-hours never summed with
the simulator's CPU-hours)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.cost import fmt_hours, total
from orchestrator.trial import TrialSpec

MAX_CELLS = 30


def cell_label(spec: TrialSpec) -> str:
    """A trial's cell: its axis labels (derived trials: plus their lineage)."""
    text = ", ".join(f"{k}={v}" for k, v in spec.axes) or spec.pool
    return text + (f" (derived from {spec.derived_from[0]})" if spec.derived_from else "")


def _by_cell(trials: Sequence[Any]) -> dict[str, dict[str, dict[str, float]]]:
    groups: dict[str, list[Any]] = {}
    for t in trials:
        groups.setdefault(t.cell, []).append(t.cost)
    return {cell: total(costs) for cell, costs in groups.items()}


def cost_json(trials: Sequence[Any]) -> dict[str, Any]:
    """``{"cost": per-unit grid totals, "cost_by_cell": {cell: per-unit totals}}``."""
    return {"cost": total(t.cost for t in trials), "cost_by_cell": _by_cell(trials)}


def cost_parts(trials: Sequence[Any]) -> list[Any]:
    """The per-cell cost table and the grid's total line (nothing before any attempt ran)."""
    from rich.markup import escape  # deferred like every rich import of the status view
    from rich.table import Table  # deferred like every rich import of the status view

    grid = total(t.cost for t in trials)
    if not grid:
        return []
    table = Table(title="cost by cell (seeds summed)", title_justify="left")
    for col in ("cell", "trials", "cost", "lost to retries", "saved by early stop"):
        table.add_column(col, overflow="fold" if col == "cell" else "ellipsis")
    cells = sorted(_by_cell(trials).items())
    for cell, units in cells[:MAX_CELLS]:
        for unit, t in units.items():
            table.add_row(escape(cell), str(int(t["trials"])), fmt_hours(t["hours"], unit),
                          fmt_hours(t["retry_hours"], unit), fmt_hours(t["saved_hours"], unit))
    parts: list[Any] = [table]
    if len(cells) > MAX_CELLS:
        parts.append(f"... {len(cells) - MAX_CELLS} more cells (ablate status --json lists all)")
    parts.append("grid cost: " + "; ".join(
        f"{fmt_hours(t['hours'], unit)} over {int(t['trials'])} trials (lost to retries "
        f"{fmt_hours(t['retry_hours'], unit)}, saved by early stop {fmt_hours(t['saved_hours'], unit)})"
        for unit, t in grid.items()))
    return parts
