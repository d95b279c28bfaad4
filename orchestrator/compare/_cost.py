"""Cost and declared comparisons in ``ablate compare``.

- ``cost.csv``: accelerator-hours (and the hours lost to retries, saved by early stop) per trial,
  per cell (seeds summed) and per grid, one row each, in each pool unit (GPU-hours and the
  simulator's CPU-hours are never summed together).
- ``comparisons.csv``: for each comparison the grid declares (``compare: {axis, baseline}``),
  every cell against its baseline cell: the difference of the target with its interval
  (``orchestrator.stats.intervals``: Newcombe for collapse rates, Welch or paired t for final reward;
  ``orchestrator.stats.survival``: the RMST difference for the time to collapse), its p-value (the
  log-rank test for the time to collapse) and the p-value adjusted over the declared comparisons
  (``multiplicity:``, Holm by default), whether it is decided (adjusted p below ``1 - level``),
  the equivalence verdict where a margin is declared, and for an undecided one the expected
  further seeds and accelerator-hours to decide it (``orchestrator.stats.seeds.seeds_to_decide``).

Both also go into ``summary.md``/``summary.html`` and a few lines on the terminal.
"""
from __future__ import annotations

import csv
import html
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare._data import TrialResult
from orchestrator.cost import fmt_hours, total
from orchestrator.exceptions import StateFileError
from orchestrator.grid import axis_label
from orchestrator.schema import AdaptiveSeedsSpec, CompareDecl
from orchestrator.stats.seeds import (
    CellKey,
    Outcome,
    cell_text,
    comparisons,
    mean_hours,
    seeds_to_decide,
)
from orchestrator.store import probe_ledger


def _cell(r: TrialResult, axis_names: Sequence[str]) -> CellKey:
    """The trial's cell: its axis labels, and its variant when it has one (an include point,
    a derived trial: a cell of its own, never pooled into the axes' cell)."""
    key = tuple((a, r.axes.get(a, "")) for a in axis_names)
    return key + ((("variant", r.variant),) if r.variant else ())


Probes = Sequence[tuple[str, dict[str, Any]]]  # (probe id, its ledger entry: label, unit, hours)


def probe_costs(grid_dir: Path) -> Probes:
    """What the grid's probes (``ablate probe``, a submit's ``preflight:``) cost, from its probe
    ledger in the workdir (none without one: a compare from the tracking server alone); a
    damaged ledger is left out with one warning."""
    try:
        return sorted(probe_ledger.read(grid_dir).items())
    except StateFileError as exc:
        print(f"warning: {exc}; cost.csv leaves the probes out", file=sys.stderr)
        return ()


def cost_section(results: Sequence[TrialResult], axis_names: Sequence[str], out: Path,
                 probes: Probes = ()) -> dict[str, Any]:
    """Write ``cost.csv``; returns the per-cell and grid totals (the grid's: its trials; the
    probes' hours are rows of their own, level ``probe``, and ``probes`` per unit)."""
    cells: dict[str, list[TrialResult]] = {}
    for r in results:
        label = cell_text(_cell(r, axis_names))
        cells.setdefault(label, []).append(r)
    by_cell = {label: total(r.cost for r in members) for label, members in cells.items()}
    grid = total(r.cost for r in results)
    # The reference evaluator's hours, where some trial has any (a column only then: the files
    # of grids without a reference evaluator are as they were).
    ref = any(r.cost is not None and r.cost.reference_hours > 0 for r in results)
    with open(out / "cost.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["level", "cell", "trial_id", "seed", "unit", "accelerator_hours", "retry_hours",
                    "early_stop_saved_hours", "trials"] + (["reference_eval_hours"] if ref else []))
        for label, members in sorted(cells.items()):
            for r in members:
                if r.cost is not None:
                    c = r.cost
                    w.writerow(["trial", label, r.trial_id, r.seed, c.unit, f"{c.hours:.6g}",
                                f"{c.retry_hours:.6g}", f"{c.saved_hours:.6g}", 1]
                               + ([f"{c.reference_hours:.6g}"] if ref else []))
        for level, rows in (("cell", sorted(by_cell.items())), ("grid", [("", grid)])):
            for label, units in rows:
                for unit, t in units.items():
                    w.writerow([level, label, "", "", unit, f"{t['hours']:.6g}", f"{t['retry_hours']:.6g}",
                                f"{t['saved_hours']:.6g}", int(t["trials"])]
                               + ([f"{t['reference_hours']:.6g}"] if ref else []))
        for pid, e in probes:
            w.writerow(["probe", e.get("label", ""), pid, "", e["unit"], f"{e['hours']:.6g}", "0", "0", 0]
                       + ([""] if ref else []))
    by_unit: dict[str, float] = {}
    for _, e in probes:
        by_unit[e["unit"]] = by_unit.get(e["unit"], 0.0) + e["hours"]
    return {"by_cell": by_cell, "grid": grid, "traced": sum(1 for r in results if r.cost is not None),
            "reference": ref, "probes": {"hours": by_unit, "count": len(probes)}}


def outcome(r: TrialResult) -> Outcome:
    """A trial as adaptive seeds and the comparisons see it (its time: the collapse step, else
    the last observed step; see ``orchestrator.stats.survival`` for early-stopped trials)."""
    step = r.verdict_step if r.collapsed and r.verdict_step is not None else r.last_step
    return Outcome(r.seed, r.collapsed, r.final(r.reward_key), r.cost.hours if r.cost else None,
                   step if r.collapsed is not None else None, r.final(M.EVAL_REWARD_REF))


def comparison_section(results: Sequence[TrialResult], axis_names: Sequence[str],
                       decls: Sequence[CompareDecl], adaptive: AdaptiveSeedsSpec | None,
                       out: Path, *, steps: int = 0, multiplicity: str = "holm") -> list[dict[str, Any]]:
    """Write ``comparisons.csv`` (when the grid declares comparisons); returns its rows."""
    if not decls:
        return []
    cells: dict[CellKey, list[Outcome]] = {}
    for r in results:
        if r.variant:  # an include point or derived trial is not one of the axes' cells
            continue
        cells.setdefault(_cell(r, axis_names), []).append(outcome(r))
    spec = adaptive or AdaptiveSeedsSpec(min=1, max=10_000)
    judged = any(r.collapsed is not None for r in results)
    targets = [adaptive.target] if adaptive else (
        ["collapse_rate", "final_reward"] + (["time_to_collapse"] if judged and steps > 0 else []))
    # A declaration's own target is always reported (its margin is on that scale).
    targets += [t for d in decls if (t := d.target) is not None and t not in targets]
    rows = []
    for target in targets:
        tspec = spec.model_copy(update={"target": target})
        for c in comparisons(cells, decls, target, spec.level, label=axis_label, horizon=steps,
                             multiplicity=multiplicity):
            a, b = cells[c.cell], cells[c.base_cell]
            more = None if c.decided else seeds_to_decide(c, a, b, tspec, steps)
            per = mean_hours(a + b)
            rows.append({"target": target, "axis": c.axis, "value": c.value, "baseline": c.baseline,
                         "context": c.context, "seeds": len(a), "baseline_seeds": len(b),
                         "difference": c.diff.estimate, "low": c.diff.low, "high": c.diff.high,
                         "p_value": c.p_value, "p_adjusted": c.p_adjusted, "multiplicity": multiplicity,
                         "family": c.family,
                         "paired": c.paired, "margin": c.margin, "equivalence": c.equivalence,
                         "decided": c.decided, "more_seeds": more,
                         "expected_hours": None if more is None or per is None else more * per,
                         "unit": next((r.cost.unit for r in results if r.cost), "")})
    with open(out / "comparisons.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["target"])
        w.writeheader()
        w.writerows(rows)
    return rows


REF_NOTE = (" Reference eval: the reference evaluator's time (`timing_s/eval_ref` inside the "
            "trials, part of their cost; `ablate evaluate` after them, not part of it).")


def _n(v: float | None, digits: int = 3) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:+.{digits}f}"


def _p(row: dict[str, Any]) -> str:
    p, q = row["p_value"], row["p_adjusted"]
    return "–" if not math.isfinite(p) else f"{p:.3g} ({q:.3g})"


def _equiv(row: dict[str, Any]) -> str:
    return "" if row["margin"] is None else f"{row['equivalence']} at ±{row['margin']:g}"


def _method(comps: Sequence[dict[str, Any]]) -> str:
    m = comps[0]["multiplicity"] if comps else "holm"
    name = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "not adjusted"}[m]
    if m == "none":
        return name
    families = {r["target"]: r["family"] for r in comps}
    sizes = ", ".join(f"{n} on {t}" for t, n in families.items())
    return f"{name}; family sizes: {sizes}"


def _more(row: dict[str, Any]) -> str:
    if row["decided"]:
        return ""
    if row["more_seeds"] is None:
        return "not decidable within max seeds at the observed difference"
    hours = row["expected_hours"]
    return f"~{row['more_seeds']} more seeds" + (f", ~{fmt_hours(hours, row['unit'])}" if hours is not None else "")


def markdown(cost: dict[str, Any], comps: Sequence[dict[str, Any]], level: float,
             esc: Callable[[str], str]) -> list[str]:
    """The cost and comparison sections of ``summary.md``."""
    lines = ["## Cost", ""]
    if not cost["traced"]:
        return lines + ["No trial run carries its cost (runs logged before cost accounting).", ""]
    ref = cost.get("reference", False)
    lines += [("Accelerator-hours: wall time x the pool's accelerators per trial (GPU-h on GPU "
               "pools, CPU-h on the simulator); `cost.csv` lists every trial."
               + (REF_NOTE if ref else "")), "",
              "| cell | trials | cost | lost to retries | saved by early stop |"
              + (" reference eval |" if ref else ""), "|---|---|---|---|---|" + ("---|" if ref else "")]
    for label, units in sorted(cost["by_cell"].items()):
        for unit, t in units.items():
            lines.append(f"| {esc(label)} | {int(t['trials'])} | {fmt_hours(t['hours'], unit)} | "
                         f"{fmt_hours(t['retry_hours'], unit)} | {fmt_hours(t['saved_hours'], unit)} |"
                         + (f" {fmt_hours(t['reference_hours'], unit)} |" if ref else ""))
    for unit, t in cost["grid"].items():
        lines.append(f"| **grid** | {int(t['trials'])} | {fmt_hours(t['hours'], unit)} | "
                     f"{fmt_hours(t['retry_hours'], unit)} | {fmt_hours(t['saved_hours'], unit)} |"
                     + (f" {fmt_hours(t['reference_hours'], unit)} |" if ref else ""))
    lines += ["", probe_line(cost)] if cost["probes"]["count"] else []
    lines.append("")
    if not comps:
        return lines
    lines += ["## Declared comparisons", "",
              (f"Difference to the baseline cell with its {level:.0%} interval (collapse rate: Newcombe's "
               "hybrid score interval from Wilson intervals; final reward: Welch t, or paired t over "
               "shared seeds; time to collapse: the difference in restricted mean collapse-free steps, "
               "tested by log-rank). p: the test's p-value, adjusted over the declared comparisons of "
               f"each target ({_method(comps)}); decided when the adjusted p is below "
               f"{1 - level:.2g}. Equivalence: TOST at the declared margin."), "",
              ("| target | comparison | where | seeds | difference [interval] | p (adjusted) | decided "
               "| equivalence | to decide |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for r in comps:
        lines.append(f"| {r['target']} | {esc(r['axis'])}={esc(r['value'])} vs {esc(r['baseline'])}"
                     f"{' (paired)' if r['paired'] else ''} | "
                     f"{esc(r['context'] or '–')} | {r['seeds']} vs {r['baseline_seeds']} | "
                     f"{_n(r['difference'])} [{_n(r['low'])}, {_n(r['high'])}] | {_p(r)} | "
                     f"{'yes' if r['decided'] else 'no'} | {_equiv(r)} | {_more(r)} |")
    undecided = [r for r in comps if not r["decided"]]
    hours = [r["expected_hours"] for r in undecided if r["expected_hours"] is not None]
    lines += ["", f"Undecided: {len(undecided)} of {len(comps)} comparisons"
              + (f"; expected cost to decide the {len(hours)} decidable within max seeds: "
                 f"{fmt_hours(sum(hours), undecided[0]['unit'])}" if hours else "") + ".", ""]
    return lines


def probe_line(cost: dict[str, Any]) -> str:
    """The probes' share of the cost, one line (``cost.csv``'s ``probe`` rows)."""
    probes = cost["probes"]
    hours = "; ".join(fmt_hours(h, u) for u, h in sorted(probes["hours"].items()))
    return (f"Probes: {probes['count']} configuration{'' if probes['count'] == 1 else 's'} probed, "
            f"{hours} (not in the grid's total; `cost.csv` rows of level `probe`).")


def terminal_lines(cost: dict[str, Any], comps: Sequence[dict[str, Any]]) -> list[str]:
    """What ``ablate compare`` prints under its table."""
    lines = ["cost: " + "; ".join(f"{fmt_hours(t['hours'], u)} over {int(t['trials'])} trials"
                                  for u, t in cost["grid"].items())] if cost["grid"] else []
    lines += [probe_line(cost)] if cost["probes"]["count"] else []
    for r in comps:
        state = "decided" if r["decided"] else "undecided" + (f" ({_more(r)})" if _more(r) else "")
        lines.append(f"{r['target']}: {r['axis']}={r['value']} vs {r['baseline']} "
                     f"({r['context'] or 'all'}): {_n(r['difference'])} [{_n(r['low'])}, {_n(r['high'])}] "
                     f"p_adj {_p(r).split(' ')[-1].strip('()')} {state}"
                     + (f"; {_equiv(r)}" if r["margin"] is not None else ""))
    return lines


def html_section(cost: dict[str, Any], comps: Sequence[dict[str, Any]], level: float) -> str:
    """The same sections for ``summary.html``."""
    esc = html.escape

    def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
                + "</table>")

    parts = ["<h2>Cost</h2>"]
    ref = cost.get("reference", False)
    rows = [(label, str(int(t["trials"])), fmt_hours(t["hours"], u), fmt_hours(t["retry_hours"], u),
             fmt_hours(t["saved_hours"], u), *([fmt_hours(t["reference_hours"], u)] if ref else []))
            for label, units in [*sorted(cost["by_cell"].items()), ("grid", cost["grid"])]
            for u, t in units.items()]
    parts.append(table(["cell", "trials", "cost", "lost to retries", "saved by early stop",
                        *(["reference eval"] if ref else [])], rows)
                 if cost["traced"] else "<p>No trial run carries its cost.</p>")
    if ref and cost["traced"]:
        parts.append(f"<p>{esc(REF_NOTE.strip().replace('`', ''))}</p>")
    if cost["probes"]["count"]:
        parts.append(f"<p>{esc(probe_line(cost).replace('`', ''))}</p>")
    if comps:
        parts.append(f"<h2>Declared comparisons</h2><p>Difference to the baseline cell with its "
                     f"{level:.0%} interval (Newcombe / Welch or paired t / RMST difference); p "
                     f"adjusted over the comparisons of each target ({_method(comps)}); decided "
                     f"when the adjusted p is below {1 - level:.2g}; equivalence by TOST.</p>")
        parts.append(table(["target", "comparison", "where", "seeds", "difference [interval]",
                            "p (adjusted)", "decided", "equivalence", "to decide"],
                           [(r["target"], f"{r['axis']}={r['value']} vs {r['baseline']}"
                             + (" (paired)" if r["paired"] else ""), r["context"] or "–",
                             f"{r['seeds']} vs {r['baseline_seeds']}",
                             f"{_n(r['difference'])} [{_n(r['low'])}, {_n(r['high'])}]", _p(r),
                             "yes" if r["decided"] else "no", _equiv(r), _more(r)) for r in comps]))
    return "\n".join(parts)
