"""Plots of ``ablate compare`` (matplotlib, Agg backend, PNG files).

Curves are faceted rows-axis x cols-axis; inside a facet each remaining configuration has one
colour and each seed one line. A cross marks the collapse step, a dotted vertical line and the
pool name mark where a resumed trial moved to another pool; a faint dotted curve shows the steps
a resume replaced (the collapse it rescued). Derived trials are dashed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare._background import start
from orchestrator.compare._cache import reuse
from orchestrator.compare._data import TrialResult
from orchestrator.compare._reference import curve_spec

MAX_FACETS = 8  # per direction; more values than that share facets (consecutive values, named)
MAX_LEGEND = 16  # legend entries; the rest are counted in one more entry
MAX_MAP_ROWS = 60  # verdict-map rows that get their own label and counts; more are thinned
MAX_MAP_HEIGHT_IN = 20.0


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _facets(results: Sequence[TrialResult], axis: str | None) -> list[tuple[str, frozenset[str]]]:
    """(title, values) of each facet along ``axis``: one value each up to ``MAX_FACETS``;
    past that, runs of consecutive values share a facet whose title names the first and last
    and counts them, so every trial is drawn and the figure keeps its size."""
    if axis is None:
        return [("", frozenset({""}))]
    values = sorted({r.axes.get(axis, "") for r in results})
    if len(values) <= MAX_FACETS:
        return [(f"{axis}={v}", frozenset({v})) for v in values]
    size = math.ceil(len(values) / MAX_FACETS)
    runs = [values[i:i + size] for i in range(0, len(values), size)]
    return [(f"{axis}={run[0]} … {run[-1]} ({len(run)} values)" if len(run) > 1 else f"{axis}={run[0]}",
             frozenset(run)) for run in runs]


def curves(results: Sequence[TrialResult], metric: str, rows: str | None, cols: str | None,
           out: Path, *, title: str, log_y: bool = False) -> Path | None:
    """Metric vs step, one facet per (rows value, cols value)."""
    have = [r for r in results if r.curves.get(metric)]
    if not have:
        return None
    plt = _plt()
    rvals, cvals = _facets(have, rows), _facets(have, cols)
    fig, axs = plt.subplots(len(rvals), len(cvals), figsize=(3.6 * len(cvals) + 1, 2.6 * len(rvals) + 0.8),
                            squeeze=False, sharex=True, sharey=True)
    others = [a for a in have[0].axes if a not in (rows, cols)]
    labels = sorted({_label(r, others) for r in have})
    colours = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    for i, (rtitle, rv) in enumerate(rvals):
        for j, (ctitle, cv) in enumerate(cvals):
            ax = axs[i][j]
            cell = [r for r in have if (rows is None or r.axes.get(rows, "") in rv)
                    and (cols is None or r.axes.get(cols, "") in cv)]
            groups: dict[tuple[Any, str], list[Any]] = {}  # one LineCollection per colour, style
            marks: list[tuple[int, float]] = []
            for r in cell:
                _draw_trial(ax, r, metric, colours[_label(r, others)], groups, marks)
            _draw_groups(ax, groups, marks, log_y)
            # y=1: where matplotlib puts it anyway (no tick labels on top), without measuring
            # every tick of the facet to decide so (a third of a 16-facet plot's time).
            ax.set_title(" / ".join(x for x in (rtitle, ctitle) if x), fontsize=8, y=1.0)
            if log_y:
                ax.set_yscale("log")
                ax.minorticks_off()
            ax.grid(alpha=0.3)
            if i == len(rvals) - 1:
                ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=colours[lab], label=lab or "trial") for lab in labels[:MAX_LEGEND]]
    if len(labels) > MAX_LEGEND:  # colours repeat past 10 anyway; say how many are not listed
        handles.append(plt.Line2D([], [], color="none", label=f"… {len(labels) - MAX_LEGEND} more"))
    handles += [plt.Line2D([], [], color="k", marker="x", ls="", label="collapse"),
                plt.Line2D([], [], color="grey", ls=":", label="pool change (resume)")]
    if any(r.superseded for r in have):
        handles.append(plt.Line2D([], [], color="grey", lw=0.8, alpha=0.4, ls=":",
                                  label="replaced by a resume"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    _facet_margins(fig, len(rvals), len(cvals))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def curve_plots(results: Sequence[TrialResult], specs: Sequence[tuple[str, Path, str, bool]],
                rows: str | None, cols: str | None) -> Callable[[], list[Path | None]]:
    """Start the curve plots ``specs`` = (metric, path, title, log_y), in a forked child past
    ``_background.CHILD_FROM`` trials; returns a function that waits for them and returns their
    paths (None: no trial has that metric)."""
    return start(lambda: [curves(results, m, rows, cols, path, title=title, log_y=log_y)
                          for m, path, title, log_y in specs], trials=len(results))



def report_curves(results: Sequence[TrialResult], reward: str, out: Path, rows: str | None,
                  cols: str | None, trials: str) -> Callable[[], list[Path | None]]:
    """The report's curve plots (``curve_plots``), reused while the trials are the same
    (``_cache``; ``trials``: the results' ``_cache.digest``)."""
    specs = [(reward, out / "curves_reward.png", f"{reward} vs step", False),
             (M.K3_KL, out / "curves_k3_kl.png", "k3 KL (rollout vs trainer)", True),
             (M.GRAD_NORM, out / "curves_grad_norm.png", "grad norm", True), curve_spec(out)]
    names = [s[1].name for s in specs]
    return reuse("curves", (trials, [(m, n, t, y) for (m, _, t, y), n in zip(specs, names)], rows, cols),
                 out, names, lambda: curve_plots(results, specs, rows, cols),
                 encode=lambda ps: [p and p.name for p in ps], decode=lambda ns: [n and out / n for n in ns])

def _facet_margins(fig: Any, nrows: int, ncols: int) -> None:
    """Fixed margins in inches for a facet grid with shared axes (tick labels only on the left
    column and bottom row): ``tight_layout`` measures every facet's ticks for the same answer,
    about half the time of a 16-facet plot."""
    width, height = fig.get_size_inches()
    # top: the suptitle (at 98% of the height) and a facet title; bottom: the legend's 8%, tick labels, 'step'
    left, right, top, bottom = 0.75, 0.15, 0.02 * height + 0.55, 0.08 * height + 0.5
    gap_w, gap_h = 0.15, 0.35  # between facets: no tick labels; a facet title above each row
    axw = (width - left - right - gap_w * (ncols - 1)) / ncols
    axh = (height - top - bottom - gap_h * (nrows - 1)) / nrows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=gap_w / axw, hspace=gap_h / axh)


def _label(r: TrialResult, axes: Sequence[str]) -> str:
    lab = ", ".join(f"{a}={r.axes.get(a, '')}" for a in axes)
    return lab + (f" [derived {r.derived_from}]" if r.derived_from else "")


def _draw_trial(ax: Any, r: TrialResult, metric: str, colour: Any,
                groups: dict[tuple[Any, str], list[Any]], marks: list[tuple[int, float]]) -> None:
    """One trial's curve into ``groups`` (drawn per facet as one collection per colour and
    style: 1,000 trials are 3,000 Line2D artists otherwise), its collapse point into ``marks``."""
    pts = [(s, v) for s, v in r.curves[metric] if math.isfinite(v)]
    if not pts:
        return
    groups.setdefault((colour, "--" if r.derived_from else "-"), []).append(pts)
    for tail in r.superseded:  # what a resume replaced (the collapse it rescued), faint
        old = [(s, v) for s, v in tail.get(metric, []) if math.isfinite(v)]
        if old:
            ax.plot(*zip(*old), color=colour, lw=0.8, alpha=0.4, ls=":")
    if r.collapsed and r.verdict_step is not None:
        marks.append(min(pts, key=lambda p: abs(p[0] - r.verdict_step)))  # type: ignore[operator]
    for seg in r.segments[1:]:
        ax.axvline(seg.start - 0.5, color="grey", ls=":", lw=1)
        ax.annotate(seg.pool, (seg.start, 1), xycoords=("data", "axes fraction"), fontsize=6,
                    va="top", rotation=90, color="grey")


def _draw_groups(ax: Any, groups: dict[tuple[Any, str], list[Any]], marks: list[tuple[int, float]],
                 log_y: bool) -> None:
    """The facet's curves, one ``LineCollection`` per (colour, style), and its collapse crosses;
    the axis limits cover them (on a log axis, their positive values, as ``plot`` would)."""
    from matplotlib.collections import LineCollection

    for (colour, ls), lines in groups.items():
        ax.add_collection(LineCollection(lines, colors=[colour], linewidths=1.0, alpha=0.85, linestyles=ls))
        pts = [p for line in lines for p in line if not log_y or p[1] > 0]
        if pts:
            ax.update_datalim(pts)
    if marks:
        ax.plot(*zip(*marks), marker="x", color="k", ms=7, mew=1.5, ls="")
    ax.autoscale_view()


def mismatch_by_bucket(results: Sequence[TrialResult], group: str | None, out: Path) -> Path | None:
    """k3 KL by the rollout probability of the sampled token (last logged value per trial),
    averaged per value of ``group`` (default the pool): seed 000's low-probability finding."""
    buckets = [(lo, hi, M.bucket_name(lo, hi)) for lo, hi in M.PROB_BUCKETS]
    have = [r for r in results if any(name in r.latest for _, _, name in buckets)]
    if not have:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for gv in sorted({r.axes.get(group, r.pool) if group else r.pool for r in have}):
        members = [r for r in have if (r.axes.get(group, r.pool) if group else r.pool) == gv]
        ys = []
        for _, _, name in buckets:
            vals = [r.latest[name] for r in members if name in r.latest and math.isfinite(r.latest[name])]
            ys.append(sum(vals) / len(vals) if vals else math.nan)
        ax.plot(range(len(buckets)), [max(y, 1e-12) if math.isfinite(y) else math.nan for y in ys],
                marker="o", label=f"{group or 'pool'}={gv} (n={len(members)})")
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([f"[{lo:g},{min(hi, 1):g})" for lo, hi, _ in buckets], rotation=30, fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("rollout probability of the sampled token")
    ax.set_ylabel("k3 KL (last step)")
    ax.set_title("Mismatch by token probability", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def verdict_map(cells: Sequence[dict[str, Any]], row_keys: Sequence[str], col_key: str | None,
                out: Path) -> Path | None:
    """Heat map of collapse rate per cell, annotated ``collapsed/judged`` and median step."""
    if not cells:
        return None
    plt = _plt()
    rlabels = sorted({" / ".join(c["row"]) for c in cells})
    clabels = sorted({c["col"] for c in cells})
    rindex = {lab: i for i, lab in enumerate(rlabels)}
    cindex = {lab: j for j, lab in enumerate(clabels)}
    grid = [[math.nan] * len(clabels) for _ in rlabels]
    # Up to MAX_MAP_ROWS rows: 0.5 in each, labelled and annotated. More: the figure stops
    # growing, rows are thin stripes and every k-th is labelled (cells.csv has every number).
    dense = len(rlabels) > MAX_MAP_ROWS
    height = min(0.5 * len(rlabels) + 1.8, MAX_MAP_HEIGHT_IN)
    fig, ax = plt.subplots(figsize=(1.8 * len(clabels) + 3, height))
    for c in cells:
        i, j = rindex[" / ".join(c["row"])], cindex[c["col"]]
        grid[i][j] = c["stats"]["collapse_rate"]
        if dense:
            continue
        s = c["stats"]
        text = f"{s['n_collapsed']}/{s['n_judged']}"
        if math.isfinite(s["median_collapse_step"]):
            text += f"\n@{s['median_collapse_step']:g}"
        if s["n_unstable"]:
            text += f"\n{s['n_unstable']} unstable"
        dark = math.isfinite(s["collapse_rate"]) and s["collapse_rate"] > 0.5
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    im = ax.imshow(grid, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(clabels)))
    ax.set_xticklabels(clabels, fontsize=8)
    every = math.ceil(len(rlabels) / MAX_MAP_ROWS)
    ax.set_yticks(range(0, len(rlabels), every))
    ax.set_yticklabels(rlabels[::every], fontsize=7)
    ax.set_xlabel(col_key or "")
    ax.set_ylabel(" / ".join(row_keys))
    fig.colorbar(im, ax=ax, label="collapse rate")
    ax.set_title("Verdicts: collapsed/judged @ median collapse step" if not dense else
                 f"Collapse rate of {len(rlabels)} rows (1 label per {every} rows; counts in cells.csv)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def importance_bars(importances: dict[str, dict[str, float]], out: Path) -> Path | None:
    """One bar group per axis, one bar per target (fANOVA importance, normalised per target)."""
    targets = [t for t, imp in importances.items() if imp]
    if not targets:
        return None
    plt = _plt()
    axes = sorted({a for t in targets for a in importances[t]})
    fig, ax = plt.subplots(figsize=(1.4 * len(axes) + 3, 3.5))
    width = 0.8 / len(targets)
    for k, t in enumerate(targets):
        ax.bar([i + k * width for i in range(len(axes))], [importances[t].get(a, 0.0) for a in axes],
               width=width, label=t)
    ax.set_xticks([i + width * (len(targets) - 1) / 2 for i in range(len(axes))])
    ax.set_xticklabels(axes, fontsize=8, rotation=15)
    ax.set_ylabel("fANOVA importance")
    ax.legend(fontsize=8)
    ax.set_title("Axis importance", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
