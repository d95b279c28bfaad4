"""Time to collapse per cell in ``ablate compare``: ``survival.csv``, ``survival.png`` and the
"Time to collapse" section of ``summary.md``/``summary.html`` (and so of the MLflow parent run's
note and artifacts).

Each cell's judged trials are survival data (``orchestrator.stats.survival``: a collapse is an event at
its verdict step, any other judged trial is censored at its last step, infra failures are left out
and counted): the Kaplan-Meier median steps to collapse with its interval, and the restricted mean
collapse-free steps up to the grid's ``steps`` (RMST) with its interval. Unlike the median step of
the collapsed trials alone, these count the trials that stayed healthy, so "collapses later" can
be shown. The log-rank test and the RMST difference of declared comparisons are in
``comparisons.csv`` (target ``time_to_collapse``).
"""
from __future__ import annotations

import csv
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.compare._cache import reuse_figure
from orchestrator.compare._data import TrialResult
from orchestrator.compare._plots import MAX_LEGEND
from orchestrator.stats import survival

WARNING_STOP = "mismatch early warning"  # how verdict reasons name a stop on the warning alone


def observation(r: TrialResult) -> survival.Observation | None:
    """The trial as survival data; None for an infra failure or a trial not judged."""
    if r.collapsed is None:
        return None
    if r.collapsed and r.verdict_step is not None:
        return survival.Observation(float(r.verdict_step), True)
    return survival.Observation(float(r.last_step), bool(r.collapsed))


def cell_survival(members: Sequence[TrialResult], horizon: int, level: float = 0.95) -> dict[str, Any]:
    """One cell's survival figures (see the module docstring)."""
    obs = [o for r in members if (o := observation(r)) is not None]
    median = survival.median_time(obs, level)
    area = survival.rmst(obs, horizon, level)[0]
    return {"n": len(obs), "events": sum(o.event for o in obs), "censored": sum(not o.event for o in obs),
            "left_out": len(members) - len(obs),
            "censored_on_warning": sum(1 for r in members if r.collapsed is False
                                       and WARNING_STOP in r.verdict_reason),
            "km_median_step": median.estimate, "km_median_lo": median.low, "km_median_hi": median.high,
            "rmst": area.estimate, "rmst_lo": area.low, "rmst_hi": area.high, "horizon": horizon}


def survival_section(results: Sequence[TrialResult], cells: Sequence[dict[str, Any]],
                     row_keys: Sequence[str], col: str | None, horizon: int, out: Path,
                     level: float = 0.95) -> dict[str, Any]:
    """Write ``survival.csv`` and ``survival.png`` for the pivot's cells; returns the rows."""
    by_id = {r.trial_id: r for r in results}
    horizon = horizon or max((r.last_step for r in results), default=0)
    rows = []
    for c in cells:
        members = [by_id[t] for t in c["trials"] if t in by_id]
        label = ", ".join(f"{k}={v}" for k, v in zip(row_keys, c["row"]) if v != "")
        if col:
            label = f"{label}, {col}={c['col']}" if label else f"{col}={c['col']}"
        rows.append({"cell": label or "(all)", **cell_survival(members, horizon, level),
                     "_obs": [o for r in members if (o := observation(r)) is not None]})
    fields = [k for k in rows[0] if not k.startswith("_")] if rows else ["cell"]
    with open(out / "survival.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    path = out / "survival.png"
    inputs = ([{k: v for k, v in r.items() if k != "_obs"} for r in rows], [r["_obs"] for r in rows], horizon)
    plot = reuse_figure("survival", inputs, path, lambda: _plot(rows, horizon, path))
    return {"rows": rows, "horizon": horizon, "level": level, "plot": plot}


def _plot(rows: Sequence[dict[str, Any]], horizon: int, path: Path) -> Path | None:
    """Kaplan-Meier curves, one per cell, censored trials marked with ``|``."""
    if not any(r["n"] for r in rows):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        obs = r["_obs"]
        if not obs:
            continue
        curve = survival.kaplan_meier(obs)
        xs, ys = [0.0], [1.0]
        for s in curve:
            xs += [s.time, s.time]
            ys += [ys[-1], s.survival]
        xs.append(float(horizon))
        ys.append(ys[-1])
        (line,) = ax.plot(xs, ys, drawstyle="default", label=f"{r['cell']} ({r['events']}/{r['n']})")
        cens = [o.time for o in obs if not o.event]
        ax.plot(cens, [_at(curve, t) for t in cens], "|", color=line.get_color(), markersize=10, mew=1.5)
    ax.set(xlabel="step", ylabel="share not collapsed (Kaplan-Meier)", ylim=(-0.03, 1.03),
           xlim=(0, horizon), title="time to collapse (| censored: ended without a collapse)")
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > MAX_LEGEND:  # past that the legend overflows the figure (and takes a second to draw)
        handles = [*handles[:MAX_LEGEND], Line2D([], [], color="none")]
        labels = [*labels[:MAX_LEGEND], f"… {len(labels) - MAX_LEGEND} more cells (survival.csv)"]
    ax.legend(handles, labels, fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _at(curve: Sequence[survival.KMStep], t: float) -> float:
    return next((s.survival for s in reversed(curve) if s.time <= t), 1.0)


def _steps(v: float) -> str:
    if math.isinf(v):
        return "not reached"
    return "–" if not math.isfinite(v) else f"{v:.0f}"


def _median(r: dict[str, Any]) -> str:
    return f"{_steps(r['km_median_step'])} [{_steps(r['km_median_lo'])}, {_steps(r['km_median_hi'])}]"


def _rmst(r: dict[str, Any]) -> str:
    return f"{_steps(r['rmst'])} [{_steps(r['rmst_lo'])}, {_steps(r['rmst_hi'])}]"


INTRO = ("Per cell, the judged trials as survival data: a collapse is an event at its verdict "
         "step; healthy, unstable and warning-stopped trials are censored at their last step; "
         "infra failures are left out. Median: Kaplan-Meier median steps to collapse with its "
         "{level:.0%} interval (not reached: fewer than half collapsed). RMST: mean collapse-free "
         "steps of the first {horizon} (restricted mean survival time) with its interval.")


def markdown(section: dict[str, Any], esc: Callable[[str], str]) -> list[str]:
    """The "Time to collapse" section of ``summary.md``."""
    rows = section["rows"]
    lines = ["## Time to collapse", "", INTRO.format(level=section["level"], horizon=section["horizon"]),
             "", ("| cell | trials | collapsed | censored | left out | median step [interval] | "
                  "RMST [interval] |"), "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {esc(r['cell'])} | {r['n']} | {r['events']} | {r['censored']} | {r['left_out']} | "
                     f"{_median(r)} | {_rmst(r)} |")
    warned = sum(r["censored_on_warning"] for r in rows)
    if warned:
        lines += ["", (f"{warned} trial{'s were' if warned > 1 else ' was'} stopped on the mismatch "
                       "early warning alone and censored there: they were stopped because a collapse "
                       "looked likely, so the curves of their cells are optimistic.")]
    return lines + [""]


def html_section(section: dict[str, Any]) -> str:
    """The same section for ``summary.html`` (the plot is embedded with the others)."""
    esc = html.escape
    head = ["cell", "trials", "collapsed", "censored", "left out", "median step [interval]",
            "RMST [interval]"]
    body = "".join("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in (
        r["cell"], r["n"], r["events"], r["censored"], r["left_out"], _median(r), _rmst(r))) + "</tr>"
        for r in section["rows"])
    return (f"<h2>Time to collapse</h2><p>{esc(INTRO.format(level=section['level'], horizon=section['horizon']))}"
            "</p><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + body + "</table>")
