"""Rescue outcomes per cell (``rescues.csv`` and a section of ``summary.md``): how many rescues
the grid's ``rescue:`` policy made in a cell, how many recovered, and the reward they gained
over their parents.

A rescue is a trial run whose ``rescue.of`` tag names its parent (``run._commits.rescue_tags``):
a derived trial (a warning's rescue, or one with ``set:``) names another trial, whose own
result is the parent's; a trial moved in place (``resume: {pool: ...}``) names itself, and the
parent's curve is its own up to the rescue's start plus the tail the resume replaced
(``superseded``). The cell is the parent's.

*Recovered*: the rescue's verdict at its end is neither ``collapsed`` nor ``numeric_failure``.
*Gain*: the rescue's final reward minus the parent's final (the last value it reached; the eval
reward where both have one, else the train reward: a parent stopped on a warning often ends
before its first evaluation), and
minus the parent's peak (for a rescue of an infra failure, the rescue's value at the parent's
last step: the parent ended for the infrastructure, not on its numbers); each the paired t interval of the mean difference over the cell's
rescues (``stats.intervals.paired_difference``), the recovered share a Wilson interval.
"""
from __future__ import annotations

import csv
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare._data import TrialResult
from orchestrator.stats.intervals import Interval, paired_difference, wilson

FAILED = ("collapsed", "numeric_failure")
INTRO = ("Rescues of the grid's rescue policy, by the parent's cell: recovered = not collapsed "
         "at the end; gain = the rescue's final reward ({key}) minus the parent's final, and "
         "minus the parent's peak (mean [{level:.0%} interval] over the cell's rescues). A parent "
         "stopped on a warning ran fewer steps than its rescue: the gain is not the warning's "
         "effect alone.")


def _parent_curve(r: TrialResult, parent: TrialResult | None, key: str) -> list[tuple[int, float]]:
    """The parent's reward curve: its own trial's, or for a rescue in place its curve up to the
    rescue's start and the tail the resume replaced."""
    if parent is not None and parent is not r:
        return parent.curves.get(key, [])
    start = int(r.rescue.get("from_step", "0") or 0)
    tail = r.superseded[0].get(key, []) if r.superseded else []
    return [(s, v) for s, v in r.curves.get(key, []) if s <= start] + list(tail)


def _outcome(r: TrialResult, parent: TrialResult | None) -> dict[str, Any]:
    """One rescue against its parent, on the eval reward where both have one, else the train
    reward (a parent stopped on an early warning often ends before its first evaluation)."""
    derived = parent is not None and parent is not r
    for key in (M.EVAL_REWARD, M.TRAIN_REWARD):
        curve = [(s, v) for s, v in _parent_curve(r, parent, key) if math.isfinite(v)]
        p_final = parent.final(key) if derived else (curve[-1][1] if curve else math.nan)
        p_peak = parent.peak(key) if derived else max((v for _, v in curve), default=math.nan)
        if math.isfinite(r.final(key)) and math.isfinite(p_final):
            break
    versus = r.final(key)
    if r.rescue.get("event") == "infra_failed" and curve:  # it ended for the infra, not on its
        upto = [v for s, v in r.curves.get(key, []) if s <= curve[-1][0] and math.isfinite(v)]
        versus = upto[-1] if upto else math.nan  # numbers: at its last step, not at the end
    return {"versus": versus, "rescue": r.trial_id, "parent": r.rescue.get("of", ""), "event": r.rescue.get("event", ""),
            "from_step": r.rescue.get("from_step", ""), "verdict": r.verdict or "",
            "recovered": r.verdict is not None and r.verdict not in FAILED, "metric": key,
            "final": r.final(key), "parent_final": p_final, "parent_peak": p_peak}


def _cell(parent: TrialResult) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(parent.axes.items())) or "(all)"


def rescue_section(results: Sequence[TrialResult], out: Path, level: float = 0.95) -> dict[str, Any] | None:
    """Write ``rescues.csv`` (one row per rescue); returns the per-cell rows, or None when the
    grid made no rescue."""
    by_id = {r.trial_id: r for r in results}
    rescues = [r for r in results if r.rescue.get("of")]
    if not rescues:
        return None
    per_cell: dict[str, list[dict[str, Any]]] = {}
    for r in rescues:
        parent = by_id.get(r.rescue["of"])
        per_cell.setdefault(_cell(parent or r), []).append(_outcome(r, parent))
    with open(out / "rescues.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["cell", "rescue", "parent", "event", "from_step", "verdict", "recovered",
                    "metric", "final", "parent final", "parent peak"])
        for cell, rows in sorted(per_cell.items()):
            for o in rows:
                w.writerow([cell, o["rescue"], o["parent"], o["event"], o["from_step"], o["verdict"],
                            o["recovered"], o["metric"], o["final"], o["parent_final"], o["parent_peak"]])
    cells = []
    for cell, rows in sorted(per_cell.items()):
        cells.append({"cell": cell, "n": len(rows), "recovered": wilson(
            sum(o["recovered"] for o in rows), len(rows), level),
            "gain_final": paired_difference([(o["versus"], o["parent_final"]) for o in rows], level),
            "gain_peak": paired_difference([(o["versus"], o["parent_peak"]) for o in rows], level)})
    keys = sorted({o["metric"] for rows in per_cell.values() for o in rows})
    return {"rows": cells, "key": " or ".join(keys), "level": level}


def _iv(i: Interval, signed: bool = True) -> str:
    if not math.isfinite(i.estimate):
        return "–"
    est = f"{i.estimate:+.3f}" if signed else f"{i.estimate:.0%}"
    if not math.isfinite(i.low):
        return f"{est} (n={i.n})"
    lo, hi = (f"{i.low:+.3f}", f"{i.high:+.3f}") if signed else (f"{i.low:.0%}", f"{i.high:.0%}")
    return f"{est} [{lo}, {hi}]"


def _cols(r: dict[str, Any]) -> list[str]:
    rec = r["recovered"]
    return [r["cell"], str(r["n"]), f"{round(rec.estimate * rec.n)} ({_iv(rec, signed=False)})",
            _iv(r["gain_final"]), _iv(r["gain_peak"])]


HEAD = ["cell", "rescues", "recovered", "gain over parent's final", "gain over parent's peak"]


def markdown(section: dict[str, Any] | None, esc: Callable[[str], str]) -> list[str]:
    """The "Rescues" section of ``summary.md`` (nothing when the grid made no rescue)."""
    if section is None:
        return []
    lines = ["", "## Rescues", "", esc(INTRO.format(key=section["key"], level=section["level"])), "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    return lines + ["| " + " | ".join([esc(c[0]), *c[1:]]) + " |" for c in map(_cols, section["rows"])]


def html_section(section: dict[str, Any] | None) -> str:
    """The same section for ``summary.html``."""
    if section is None:
        return ""
    esc = html.escape
    body = "".join("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in _cols(r)) + "</tr>" for r in section["rows"])
    return (f"<h2>Rescues</h2><p>{esc(INTRO.format(key=section['key'], level=section['level']))}</p>"
            "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in HEAD) + "</tr>" + body + "</table>")
