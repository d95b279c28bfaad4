"""The findings report's section on fair evaluation (issue 41): every trial's checkpoints scored
by one reference evaluator (``ablate evaluate``: the fp32 trainer-side model with the
checkpoint's weights, the same for every arm), beside its own engine's eval.

Per trial the comparison is made at the last step that has both numbers (a checkpoint step that
is also an eval step: every 50 steps in the findings grid), so both score the trainer's state at
that step: the reference its current weights in fp32, the arm's own engine the weights it serves
then (on sim-a100 two syncs stale, int4) in its pool's arithmetic. Per cell (arch, pool, correction, engine; grid trials only): the mean of each over
seeds and the paired difference own - reference with its 95% t interval; a cell where that
interval excludes 0 is one whose own engine scores its policy differently from the shared
evaluator.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from orchestrator import metrics as M
from orchestrator.stats.intervals import t_interval

COMMAND = "ablate evaluate grids/findings/findings.yaml --workdir .ablate-findings"


def common_final(r: Any) -> tuple[int, float, float] | None:
    """(step, own eval, reference eval) at the last step with both, or None."""
    own = {s: v for s, v in r.curves.get(M.EVAL_REWARD, []) if math.isfinite(v)}
    ref = {s: v for s, v in r.curves.get(M.EVAL_REWARD_REF, []) if math.isfinite(v)}
    steps = sorted(set(own) & set(ref))
    return (steps[-1], own[steps[-1]], ref[steps[-1]]) if steps else None


def cells(res: Sequence[Any], label: Any) -> list[dict[str, Any]]:
    """One row per cell of grid trials with both numbers (``label``: the corr label)."""
    groups: dict[tuple[str, ...], list[tuple[int, float, float]]] = {}
    for r in res:
        point = None if r.derived_from else common_final(r)
        if point is not None:
            key = (str(r.axes.get("arch")), r.pool, label(r), str(r.axes.get("engine")))
            groups.setdefault(key, []).append(point)
    rows = []
    for key, points in sorted(groups.items()):
        diff = t_interval([o - f for _, o, f in points])
        rows.append({"cell": key, "n": len(points), "steps": sorted({s for s, _, _ in points}),
                     "own": statistics.fmean(o for _, o, _ in points),
                     "ref": statistics.fmean(f for _, _, f in points), "diff": diff,
                     "disagree": math.isfinite(diff.low) and (diff.low > 0 or diff.high < 0)})
    return rows


def _iv(iv: Any) -> str:
    if not math.isfinite(iv.estimate):
        return "–"
    tail = f" [{iv.low:+.3f}, {iv.high:+.3f}]" if math.isfinite(iv.low) else ""
    return f"{iv.estimate:+.3f}{tail}"


def section(res: Sequence[Any], label: Any) -> list[str]:
    """The report's lines (a note with the command when no trial has reference scores)."""
    lines = ["## Own engine vs one reference evaluator (issue 41)", ""]
    rows = cells(res, label)
    if not rows:
        return lines + [(f"No trial has reference scores yet: `{COMMAND}` scores the saved "
                        "checkpoints (phase `evaluate` of this script), then the report shows "
                        "them."), ""]
    lines += [__doc__.split("\n\n", 1)[1].replace("\n", " ").strip()
              .replace("``", "`"), "",
              ("| arch | pool | corr | engine | seeds | step | own eval | reference eval | "
              "own - reference [95%] | disagree |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        arch, pool, corr, engine = row["cell"]
        lines.append(f"| {arch} | {pool} | {corr} | {engine} | {row['n']} | "
                     f"{'/'.join(map(str, row['steps']))} | {row['own']:.3f} | {row['ref']:.3f} | "
                     f"{_iv(row['diff'])} | {'yes' if row['disagree'] else 'no'} |")
    bad = [row for row in rows if row["disagree"]]
    lines += ["", f"Own and reference disagree in {len(bad)} of {len(rows)} cells"
              + (": " + "; ".join(f"{r['cell'][1]} {r['cell'][2]} ({r['cell'][0]}, "
                                  f"{r['cell'][3]}): own {r['own']:.3f} vs reference {r['ref']:.3f}"
                                  for r in bad) if bad else "") + ".", ""]
    return lines
