"""``ablate compare``: comparison tables, plots and axis importance for one grid.

Reads the grid's trial runs from MLflow (``compare_data``), pivots them by two axes (the other
axes become part of the row label; seeds are aggregated with mean and 95% CI, ``compare_stats``),
draws the plots (``compare_plots``) and writes ``results/<grid>/``:

- ``summary.md``, ``summary.html`` (self-contained: plots embedded), ``cells.csv`` (one row per
  cell, numbers only), ``trials.csv`` (one row per trial), ``importance.csv``, ``cost.csv`` and,
  when the grid declares comparisons, ``comparisons.csv`` (``_cost``), ``survival.csv`` (time to
  collapse per cell, ``_survival``), ``rescues.csv`` (when the grid rescued trials, ``_rescues``);
- ``survival.png``, ``curves_reward.png``, ``curves_k3_kl.png``, ``curves_grad_norm.png``, ``mismatch_by_prob.png``,
  ``verdict_map.png``, ``importance.png``;
- ``MANIFEST.json`` (``orchestrator.compare.manifest``): code version, the hash of what decides the numbers,
  the trials' numeric environments, the command that regenerates the directory.

The same files are logged as artifacts (``results/``) of the grid's newest parent run, with the
grid's summary table (``_parent``), and a compact table is printed to the terminal.
"""
from __future__ import annotations

import base64
import html
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare import _cost as C
from orchestrator.compare import _data as D
from orchestrator.compare import _plots as P
from orchestrator.compare import _reference as RF
from orchestrator.compare import _rescues as RS
from orchestrator.compare import _runs as R
from orchestrator.compare import _survival as S
from orchestrator.compare import manifest
from orchestrator.compare import markdown as md
from orchestrator.compare._background import start
from orchestrator.compare._cache import digest, reuse, reuse_figure
from orchestrator.compare._data import TrialResult, judge_missing, load_results, split_unfinished
from orchestrator.compare._parent import log_to_parent
from orchestrator.compare._stats import (
    cell_stats,
    fanova_importance,
    fanova_note,
    format_cell,
    main_effects,
)
from orchestrator.compare._where import where_recorded
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.grid import load_grid
from orchestrator.scheduler import as_submitted, renamed
from orchestrator.schema import DEFAULT_RANGE, AdaptiveSeedsSpec, CompareDecl
from orchestrator.sim.numerics import environments
from orchestrator.store import workspace
from orchestrator.store.summary_table import LocalMetrics
from orchestrator.tracking import store_exists

log = logging.getLogger(__name__)
VARIANT = "variant"  # row-label column: include points, derived trials (`ablate resume --set`)


def pick_axes(axes: Sequence[str], rows: str | None, cols: str | None) -> tuple[str | None, str | None]:
    """Validate ``--rows``/``--cols``; defaults: the first non-pool axis x the pool axis."""
    for flag, value in (("--rows", rows), ("--cols", cols)):
        if value is not None and value not in axes:
            tails = [a for a in axes if a.endswith("." + value)]  # `is_level` for `correction.is_level`
            hint = tails[0] if len(tails) == 1 else did_you_mean(value, axes)
            raise UserError(f"{flag} {value!r} is not an axis of this grid; allowed: {', '.join(axes)}"
                            + (f"; did you mean {hint!r}?" if hint else ""))
    if cols is None:
        cols = "pool" if "pool" in axes and rows != "pool" else next((a for a in axes if a != rows), None)
    if rows is None:
        rows = next((a for a in axes if a != cols), None)
    if rows is not None and rows == cols:
        raise UserError(f"--rows and --cols are both {rows!r}; fix: pick two different axes")
    return rows, cols


def compare(grid_path: str | Path, *, rows: str | None = None, cols: str | None = None,
            out_dir: str | Path | None = None, tracking_uri: str | None = None,
            workdir: str | Path | None = None, name: str | None = None) -> Path:
    """Write ``results/<grid>/`` for the grid's tracked trials (``name``: the grid as submitted
    under another name; its backend: as submitted); returns the directory."""
    grid = renamed(load_grid(grid_path), name)
    grid_dir = workspace.grid_dir(grid.name, workdir)
    grid = as_submitted(grid, grid_dir)
    axis_names = [a.name for a in grid.axes]
    rows, cols = pick_axes(axis_names, rows, cols)
    uri = workspace.tracking_uri(tracking_uri, workdir)
    if not store_exists(uri):  # a reader creates no empty store (nor MLflow's INFO lines)
        raise UserError(f"grid {grid.name!r} has not run: there is no MLflow store at "
                        f"{workspace.canonical_uri(uri)}; fix: `ablate submit "
                        f"{grid_path}` first, or pass --tracking-uri (or --workdir) where it ran")
    stamp = R.store_stamp(uri)  # before anything is read: a later write changes it

    def experiment(mlc: Any) -> str:
        exp = mlc.get_experiment_by_name(grid.name)
        if exp is None:
            raise UserError(f"grid {grid.name!r} has no MLflow experiment in "
                            f"{workspace.canonical_uri(uri)}; "
                            + where_recorded(grid, grid_dir, workspace.canonical_uri(uri)))
        return str(exp.experiment_id)
    mlc = R.LazyClient(uri)  # MLflow is imported only where the kept run list is not enough
    found = R.listing(uri, grid.name, stamp, mlc, experiment)
    local = LocalMetrics.read(grid_dir)  # one pass over the workdir: states, summaries, checks
    notes: list[str] = []
    results, unfinished = split_unfinished(
        load_results(mlc, found.experiment_id, axis_names, grid_dir=grid_dir, fixed_pool=grid.spec.pool,
                     local=local, tracking_uri=uri, grid=grid.name, warnings=notes, runs=found.runs),
        grid_dir, states=local.states)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    if not results and unfinished:
        raise UserError(f"grid {grid.name!r}: no trial has finished yet; {unfinished.describe()}; "
                        f"fix: wait for the first to finish (`ablate status {grid.name}`)")
    for tid, error in local.unreadable.items():
        print(f"warning: trial {tid} is left out of every table: {error}", file=sys.stderr)
    for problem in local.problems:
        # The tables come from MLflow; the trial's own record of its steps is what is damaged.
        print(f"warning: {problem}; fix: `ablate submit` the grid again (it restores the steps "
              "from MLflow, or recomputes them from a checkpoint)", file=sys.stderr)
    if not results:
        raise UserError(f"grid {grid.name!r} has no trial runs in "
                        f"{workspace.canonical_uri(uri)}; "
                        + where_recorded(grid, grid_dir, workspace.canonical_uri(uri)))
    judge_missing(results, grid.spec.collapse, grid.spec.steps)
    out = Path(out_dir) if out_dir else Path("results") / grid.name
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(results, axis_names, rows, cols, out, grid_name=grid.name,
                          store=workspace.display_uri(uri, workdir),
                          unfinished=unfinished.describe() if unfinished else None,
                          compare=grid.spec.comparisons, adaptive=grid.spec.adaptive, steps=grid.spec.steps,
                          probes=C.probe_costs(grid_dir), multiplicity=grid.spec.multiplicity,
                          reward_range=grid.spec.metrics.bounds("reward"),
                          pool_kinds=frozenset(p.kind for p in grid.pools.pools.values()
                                               if p.name in {r.pool for r in results}))
    manifest.write(out, manifest.for_grid(grid_path, out, backend=grid.backend, environments=manifest.numeric_environments(
        r.numerics for r in results), evaluated=RF.present(results) and not grid.spec.eval.reference))
    digest = R.results_digest(out)
    if not (found.cached and found.published == digest):  # else the parent run holds them
        found.published = log_to_parent(mlc, found.experiment_id, out, grid.name, local.summaries, digest)
    if not found.cached:
        R.keep(uri, grid.name, stamp, found)
    print_table(report)
    if unfinished:
        print(f"compared the {len(results)} finished trial{'' if len(results) == 1 else 's'}; "
              f"{unfinished.describe()}: run `ablate compare` again when they end")
    return out


def build_report(results: Sequence[TrialResult], axis_names: Sequence[str], rows: str | None,
                 cols: str | None, out: Path, *, grid_name: str, store: str,
                 unfinished: str | None = None, compare: Sequence[CompareDecl] = (),
                 adaptive: AdaptiveSeedsSpec | None = None, steps: int = 0,
                 multiplicity: str = "holm", reward_range: tuple[float, float] = DEFAULT_RANGE,
                 pool_kinds: frozenset[str] = frozenset({"sim"}),
                 probes: C.Probes = ()) -> dict[str, Any]:
    """Tables, plots and importance for ``results``; returns what the terminal table needs.
    ``unfinished`` says which trials are not in it yet (a grid still running); ``steps``: the
    grid's steps (the horizon of the time to collapse; 0: the longest trial's); ``reward_range``:
    the reward's declared range (``metrics.range.reward``), which its cell intervals stay in;
    ``pool_kinds``: the trials' pools' kinds (which reference evaluator the section names)."""
    variants = any(r.variant for r in results)
    row_keys = [a for a in axis_names if a != cols and a != rows]
    row_keys = ([rows] if rows else []) + row_keys + ([VARIANT] if variants else [])
    reward = M.EVAL_REWARD if any(r.curves.get(M.EVAL_REWARD) for r in results) else M.TRAIN_REWARD
    trials = digest(results)  # the trials in the pieces' cache keys, hashed once
    curves = P.report_curves(results, reward, out, rows, cols, trials)
    forests = reuse("fanova", (trials, list(axis_names)), out, [], lambda: start(
        lambda: {t: fanova_importance(results, axis_names, t) for t in ("final_reward", "collapsed")},
        trials=len(results)))  # in a child too past CHILD_FROM trials: a third of the rest
    cells = pivot(results, row_keys, cols, reward_range)
    _write_csvs(results, cells, row_keys, cols, out)
    effects = main_effects(results, axis_names)
    group = cols if cols == "pool" else None
    mismatch = reuse_figure("mismatch", (trials, group), out / "mismatch_by_prob.png",
                            lambda: P.mismatch_by_bucket(results, group, out / "mismatch_by_prob.png"))
    verdicts = reuse_figure("verdicts", (cells, row_keys, cols), out / "verdict_map.png",
                            lambda: P.verdict_map(cells, row_keys, cols, out / "verdict_map.png"))
    level = adaptive.level if adaptive else 0.95
    surv = S.survival_section(results, cells, row_keys, cols, steps, out, level)
    cost = C.cost_section(results, axis_names, out, probes)
    comparisons = C.comparison_section(results, axis_names, compare, adaptive, out,
                                       steps=surv["horizon"], multiplicity=multiplicity)
    importance = forests()
    _write_importance(effects, importance, out)
    other_plots = [mismatch, verdicts, reuse_figure("importance", json.dumps(importance), out / "importance.png",
                                                    lambda: P.importance_bars(importance, out / "importance.png"))]
    plots = [p for p in [*curves(), *other_plots, surv["plot"]] if p is not None]
    report = {"grid": grid_name, "store": store, "rows": row_keys, "cols": cols, "cells": cells,
              "results": results, "effects": effects, "importance": importance, "plots": plots,
              "reward_metric": reward, "environments": environments(r.numerics for r in results),
              "cost": cost, "comparisons": comparisons,
              "survival": surv, "level": level, "fanova_note": fanova_note(results, axis_names),
              "rescues": RS.rescue_section(results, out, level),
              "reference_intro": RF.intro(pool_kinds, frozenset(
                  r.reference_job for r in results if r.reference_job))}
    if unfinished:
        report["unfinished"] = unfinished
    (out / "summary.md").write_text(render_markdown(report))
    (out / "summary.html").write_text(render_html(report))
    return report


def _row_of(r: TrialResult, row_keys: Sequence[str]) -> tuple[str, ...]:
    out = []
    for k in row_keys:
        if k == VARIANT:
            out.append(r.variant)
        else:
            out.append(r.axes.get(k, ""))
    return tuple(out)


def pivot(results: Sequence[TrialResult], row_keys: Sequence[str], col: str | None,
          reward_range: tuple[float, float] = DEFAULT_RANGE) -> list[dict[str, Any]]:
    """One cell per (row label, column value): the seeds of one configuration, aggregated."""
    groups: dict[tuple[tuple[str, ...], str], list[TrialResult]] = {}
    for r in results:
        groups.setdefault((_row_of(r, row_keys), r.axes.get(col, "") if col else ""), []).append(r)
    return [{"row": row, "col": c, "trials": [t.trial_id for t in members], "stats": cell_stats(members, reward_range)}
            for (row, c), members in sorted(groups.items())]


def _write_csvs(results: Sequence[TrialResult], cells: Sequence[dict[str, Any]], row_keys: Sequence[str],
                col: str | None, out: Path) -> None:
    import pandas as pd

    cell_rows = []
    for c in cells:
        row = dict(zip(row_keys, c["row"]))
        if col:
            row[col] = c["col"]
        row.update({k: v for k, v in c["stats"].items()})
        row["trials"] = " ".join(c["trials"])
        cell_rows.append(row)
    pd.DataFrame(cell_rows).to_csv(out / "cells.csv", index=False)
    trial_rows = []
    for r in results:
        trial_rows.append({"trial_id": r.trial_id, "run_id": r.run_id, **r.axes, "seed": r.seed,
                           "pool": r.pools_run, "status": r.status, "verdict": r.verdict,
                           "verdict_step": r.verdict_step, "verdict_reason": r.verdict_reason,
                           "derived_from": r.derived_from or "", "last_step": r.last_step,
                           "final_reward": r.final(r.reward_key), "peak_reward": r.peak(r.reward_key),
                           "max_k3_kl": r.peak(M.K3_KL), "max_grad_norm": r.peak(M.GRAD_NORM),
                           "skipped_share": r.skipped_share, **RF.trial_columns(r),
                           "not_applicable": ";".join(r.not_applicable),
                           "attempts": ";".join(f"{s.number}:{s.pool}:{s.start}-{s.end or ''}"
                                                for s in r.segments)})
    pd.DataFrame(trial_rows).to_csv(out / "trials.csv", index=False)


def _write_importance(effects: Sequence[dict[str, Any]], importance: dict[str, dict[str, float]],
                      out: Path) -> None:
    import pandas as pd

    rows = []
    for e in effects:
        target = "collapsed" if e["target"] == "collapse_rate" else e["target"]
        rows.append({"axis": e["axis"], "target": e["target"], "main_effect": e["effect"],
                     "fanova_importance": importance.get(target, {}).get(e["axis"], math.nan),
                     **{f"mean[{k}]": v for k, v in e["means"].items()}})
    pd.DataFrame(rows).to_csv(out / "importance.csv", index=False)


def _table(report: dict[str, Any], fmt: Any) -> tuple[list[str], list[list[str]]]:
    """Header and body of the pivot table with cells rendered by ``fmt(stats)``."""
    cols = sorted({c["col"] for c in report["cells"]})
    col_key = report["cols"]
    header = list(report["rows"]) + [f"{col_key}={c}" if col_key else "all" for c in cols]
    body = []
    by_row: dict[tuple[str, ...], dict[str, dict[str, Any]]] = {}  # grouped once: O(cells)
    for c in report["cells"]:
        by_row.setdefault(c["row"], {})[c["col"]] = c
    for row in sorted(by_row):
        by_col = by_row[row]
        body.append(list(row) + [fmt(by_col[c]["stats"]) if c in by_col else "" for c in cols])
    return header, body


def _verdict_counts(results: Sequence[TrialResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict or "unknown"] = counts.get(r.verdict or "unknown", 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def render_markdown(report: dict[str, Any]) -> str:
    res = report["results"]
    header, body = _table(report, format_cell)
    # Every user-given string (labels, pools, reasons, the store) goes through md.text/md.code.
    lines = [f"# Grid {md.code(report['grid'])}: comparison", "",
             (f"{len(res)} trials from {md.code(report['store'])}; verdicts: "
              f"{md.text(_verdict_counts(res))}."),
             (f"Cells: final and peak {md.code(report['reward_metric'])} (mean [95% interval] over "
              "seeds, inside [0, 1] for a reward there), collapsed/judged trials @ median step of "
              "the collapsed ones (see Time to collapse for the median over all), max k3 KL."), "",
             *environment_lines(report), *D.not_applicable_lines(res, md.text), "",
             "| " + " | ".join(md.text(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    # The row labels are the user's; the cells are ours (format_cell's <br> line breaks).
    n = len(report["rows"])
    lines += ["| " + " | ".join(md.text(x) if i < n else x for i, x in enumerate(r)) + " |"
              for r in body]
    if report.get("unfinished"):  # under the title: these are partial results
        lines.insert(3, f"**Partial: {md.text(report['unfinished'])}; compare again when they end.**")
    lines += ["", "## Axis importance", "",
              "| axis | target | main effect (spread of means) | fANOVA importance |", "|---|---|---|---|"]
    for e in report["effects"]:
        target = "collapsed" if e["target"] == "collapse_rate" else e["target"]
        imp = report["importance"].get(target, {}).get(e["axis"])
        lines.append(f"| {md.text(e['axis'])} | {md.text(e['target'])} | {_num(e['effect'])} | "
                     f"{'–' if imp is None else f'{imp:.3f}'} |")
    if report.get("fanova_note"):
        lines += ["", md.text(report["fanova_note"])]
    if "survival" in report:
        lines += ["", *S.markdown(report["survival"], md.text), *RS.markdown(report.get("rescues"), md.text)]
    if "cost" in report:
        lines += ["", *C.markdown(report["cost"], report["comparisons"], report["level"], md.text)]
    lines += ["", *RF.markdown(report, md.text), "## Trials", "", "| trial | run | seed | pool | verdict | step | reason |",
              "|---|---|---|---|---|---|---|"]
    for r in res:
        lines.append(f"| {md.text(r.trial_id)} | {md.text(r.run_id[:8])} | {r.seed} | "
                     f"{md.text(r.pool)} | {md.text(r.verdict or '?')} | "
                     f"{'' if r.verdict_step is None else r.verdict_step} | "
                     f"{md.text(r.verdict_reason[:160])} |")
    lines += ["", "## Plots", ""] + [f"![{md.text(p.stem)}](<{p.name}>)" for p in report["plots"]]
    return "\n".join(lines) + "\n"


def environment_lines(report: dict[str, Any]) -> list[str]:
    """Where the numbers were computed: one line, or a warning listing each environment when
    the compared trials ran under different ones (their numbers are then not comparable bit
    for bit; see orchestrator/sim/numerics.py)."""
    envs = report.get("environments") or {}
    if not envs:
        return []
    if len(envs) == 1:
        (n, text), = envs.values()
        return [f"Numeric environment ({n} trials): {md.text(text)}."]
    lines = [(f"**Warning: the trials ran under {len(envs)} different numeric environments**; "
              "numbers that differ between them may differ by the machine, not by the axes:")]
    lines += [f"- {md.code(fp)} ({n} trials): {md.text(text)}" for fp, (n, text) in envs.items()]
    return lines


def _num(v: float) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.3f}"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;
margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f3f3f3}td.c{white-space:nowrap}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.collapsed{background:#fde0dc}"""


def render_html(report: dict[str, Any]) -> str:
    """A single self-contained page (inline CSS, plots as data: URIs, no external requests)."""
    esc = html.escape
    header, body = _table(report, lambda s: s)
    n_rows = len(report["rows"])
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(report['grid'])}</title>",
             f"<style>{CSS}</style></head><body><h1>Grid {esc(report['grid'])}</h1>",
             (f"<p>{len(report['results'])} trials from <code>{esc(report['store'])}</code>; verdicts: "
              f"{esc(_verdict_counts(report['results']))}. Cells: final / peak {esc(report['reward_metric'])} "
              "(mean [95% interval] over seeds), collapsed/judged @ median step of the collapsed, "
              "max k3 KL.</p>"),
             *(f"<p>{esc(line.replace('**', '').replace('`', ''))}</p>"
               for line in environment_lines(report)),
             "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    if report.get("unfinished"):  # under the title: these are partial results
        parts.insert(2, f"<p class='partial'><b>Partial: {esc(report['unfinished'])}; compare "
                        "again when they end.</b></p>")
    for row in body:
        tds = [f"<td>{esc(x)}</td>" for x in row[:n_rows]]
        for st in row[n_rows:]:
            if not st:
                tds.append("<td></td>")
                continue
            klass = "c collapsed" if st["n_collapsed"] else "c"
            text = format_cell(st, "\n")
            tds.append(f"<td class='{klass}'>" + "<br>".join(esc(p) for p in text.split("\n")) + "</td>")
        parts.append("<tr>" + "".join(tds) + "</tr>")
    parts.append("</table><h2>Axis importance</h2><table><tr><th>axis</th><th>target</th>"
                 "<th>main effect</th><th>fANOVA importance</th></tr>")
    for e in report["effects"]:
        target = "collapsed" if e["target"] == "collapse_rate" else e["target"]
        imp = report["importance"].get(target, {}).get(e["axis"])
        parts.append(f"<tr><td>{esc(e['axis'])}</td><td>{esc(e['target'])}</td><td>{_num(e['effect'])}</td>"
                     f"<td>{'–' if imp is None else f'{imp:.3f}'}</td></tr>")
    parts.append("</table>")
    if report.get("fanova_note"):
        parts.append(f"<p>{esc(report['fanova_note'])}</p>")
    if "survival" in report:
        parts += [S.html_section(report["survival"]), RS.html_section(report.get("rescues"))]
    if "cost" in report:
        parts.append(C.html_section(report["cost"], report["comparisons"], report["level"]))
    parts.append(RF.html_section(report) + "<h2>Trials</h2><table><tr><th>trial</th><th>seed</th><th>pool</th><th>verdict</th>"
                 "<th>step</th><th>reason</th></tr>")
    for r in report["results"]:
        parts.append(f"<tr><td>{esc(r.trial_id)}</td><td>{r.seed}</td><td>{esc(r.pool)}</td>"
                     f"<td>{esc(r.verdict or '?')}</td><td>{'' if r.verdict_step is None else r.verdict_step}</td>"
                     f"<td>{esc(r.verdict_reason[:200])}</td></tr>")
    parts.append("</table><h2>Plots</h2>")
    for p in report["plots"]:
        data = base64.b64encode(Path(p).read_bytes()).decode()
        parts.append(f"<h3>{esc(p.stem)}</h3><img alt='{esc(p.stem)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def print_table(report: dict[str, Any]) -> None:
    """A compact version of the pivot on the terminal (final reward [interval], collapses)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def short(s: dict[str, Any]) -> str:
        fm, lo, hi = s["final_reward"], s["final_reward_lo"], s["final_reward_hi"]
        txt = "–" if not math.isfinite(fm) else f"{fm:.2f}" + (
            "" if not math.isfinite(lo) else f" [{lo:.2f},{hi:.2f}]")
        coll = f"{s['n_collapsed']}/{s['n_judged']}"
        return f"[red]{txt} ✗{coll}[/red]" if s["n_collapsed"] else f"{txt} ✓{coll}"

    header, body = _table(report, short)
    table = Table(title=escape(f"{report['grid']}: final reward [95% interval], collapsed/judged"),
                  title_justify="left")
    for h in header:  # user-given labels are text, not rich markup ("[null, 2.0]" is no tag)
        table.add_column(escape(h), overflow="fold")
    labels = len(report["rows"])
    for row in body:
        table.add_row(*(escape(c) for c in row[:labels]), *row[labels:])
    console = Console(soft_wrap=False)
    console.print(table)
    if "cost" in report:
        for line in C.terminal_lines(report["cost"], report["comparisons"]):
            console.print(line, markup=False)
    envs = report.get("environments") or {}
    if len(envs) > 1:
        console.print(f"[yellow]warning: these trials ran under {len(envs)} different numeric "
                      "environments; see summary.md[/yellow]")
