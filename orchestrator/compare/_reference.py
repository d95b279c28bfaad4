"""The reference evaluation in ``ablate compare`` (a grid with ``eval: {reference: ...}``, or
trials scored after the fact by ``ablate evaluate``; ``orchestrator/evaluation.py``).

Each cell gets both numbers: its final ``eval/reward`` (the arm's own engine) and its final
``eval/reward_ref`` (one evaluator for every arm), and the paired difference own - reference
over its seeds. Where that interval excludes 0, the arm's own engine scores its policy
differently from the shared evaluator: its own number mixes the engine into the result, and the
section says so. The columns and the section appear only where some trial has a reference
score, so the files of grids without one are as before.
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator import metrics as M
from orchestrator.compare._data import TrialResult
from orchestrator.schema import DEFAULT_RANGE
from orchestrator.stats.intervals import bounded_mean, paired_difference

REF = M.EVAL_REWARD_REF


def _ref(r: TrialResult) -> float:
    return r.final(REF)


def _pair(r: TrialResult) -> tuple[float, float] | None:
    """The trial's own score and its reference score at the last step it has both: an own
    score at step 20 is not paired with a reference at step 10 (a checkpoint ``ablate evaluate``
    could not score), but with the own score at step 10. None without a common step."""
    own = {s: v for s, v in r.curves.get(r.reward_key, []) if math.isfinite(v)}
    common = {s: v for s, v in r.curves.get(REF, []) if math.isfinite(v) and s in own}
    if not common:
        return None
    last = max(common)
    return own[last], common[last]


def present(results: Sequence[TrialResult]) -> bool:
    """Whether some trial has a reference score."""
    return any(math.isfinite(_ref(r)) for r in results)


def cell_stats(results: Sequence[TrialResult],
               reward_range: tuple[float, float] = DEFAULT_RANGE) -> dict[str, Any]:
    """The cell's reference final and peak (mean [interval] over seeds) and own - reference
    (paired over the seeds that have both, each at its last step with both, ``_pair``); empty
    when no seed has a reference score."""
    if not present(results):
        return {}
    final = bounded_mean([_ref(r) for r in results], *reward_range)
    peak = bounded_mean([r.peak(REF) for r in results], *reward_range)
    diff = paired_difference([p for r in results if (p := _pair(r)) is not None])
    return {"n_reward_ref": final.n, "final_reward_ref": final.estimate,
            "final_reward_ref_lo": final.low, "final_reward_ref_hi": final.high,
            "peak_reward_ref": peak.estimate, "peak_reward_ref_lo": peak.low,
            "peak_reward_ref_hi": peak.high, "own_minus_ref": diff.estimate,
            "own_minus_ref_lo": diff.low, "own_minus_ref_hi": diff.high}


def trial_columns(r: TrialResult) -> dict[str, float]:
    """``trials.csv`` columns of a trial with a reference score (none otherwise)."""
    if not math.isfinite(_ref(r)):
        return {}
    return {"final_reward_ref": _ref(r), "peak_reward_ref": r.peak(REF)}


def curve_spec(out: Any) -> tuple[str, Any, str, bool]:
    """The reference curves' plot (drawn only where some trial has them)."""
    return (REF, out / "curves_reward_ref.png", f"{REF} (one evaluator for every arm) vs step",
            False)


def _fmt(v: float, lo: float = math.nan, hi: float = math.nan) -> str:
    if not math.isfinite(v):
        return "–"
    return f"{v:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) and math.isfinite(hi) else "")


def disagrees(s: dict[str, Any]) -> bool:
    """The cell's own - reference interval excludes 0."""
    lo, hi = s.get("own_minus_ref_lo", math.nan), s.get("own_minus_ref_hi", math.nan)
    return math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0)


def rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(cell label, stats) of every cell with a reference score."""
    names = list(report["rows"]) + ([report["cols"]] if report["cols"] else [])
    out = []
    for c in report["cells"]:
        s = c["stats"]
        if math.isfinite(s.get("final_reward_ref", math.nan)):
            labels = list(c["row"]) + ([c["col"]] if report["cols"] else [])
            out.append((", ".join(f"{k}={v}" for k, v in zip(names, labels)) or "(all)", s))
    return out


def _summary_lines(found: list[tuple[str, dict[str, Any]]]) -> list[str]:
    bad = [label for label, s in found if disagrees(s)]
    best_own, best_ref = _best(found, "final_reward"), _best(found, "final_reward_ref")
    lines = [f"Own and reference disagree (own - reference excludes 0) in {len(bad)} of "
             f"{len(found)} cells" + (f": {'; '.join(bad)}." if bad else ".")]
    if len(found) > 1 and len(best_own) == len(best_ref) == len(found):
        lines.append("Every cell has the same final value by either number: neither ranks them.")
    elif best_own != best_ref:
        lines.append(f"The best cell by the arms' own engines ({'; '.join(best_own)}) is not the "
                     f"best by the reference ({'; '.join(best_ref)}).")
    else:
        lines.append(f"The best cell is the same by either number ({'; '.join(best_own)}).")
    return lines


def _best(found: list[tuple[str, dict[str, Any]]], key: str) -> list[str]:
    """The cells with the highest final ``key`` (several when they tie)."""
    top = max(_key(s[key]) for _, s in found)
    return [label for label, s in found if _key(s[key]) == top]


def _key(v: float) -> float:
    return v if math.isfinite(v) else -math.inf


INTRO = ("Every eval step was also scored by one reference evaluator, the same for every arm "
         f"(`{REF}`: the trainer-side model in fp32 with the current weights, on the same held-out "
         "prompts with the same sampling noise per seed). Own: the arm's own engine "
         "(`eval/reward`: its pool's numerics and engine flags, stale weights where the pool "
         "lags). Final values, mean [95% interval] over seeds; own - reference paired by trial.")
VERL_INTRO = ("Every saved checkpoint was also scored by one reference evaluator, the same for "
              f"every arm (`{REF}`: the trainer-side model in fp32 with the checkpoint's weights, "
              "greedy on the recipe's validation prompts, averaged as verl averages its own "
              "validation; docs/evaluation.md). Own: the arm's own rollout engine (`eval/reward`: "
              "verl's validation through its engine, dtype and flags). Final values (the last "
              "step, which verl always saves), mean [95% interval] over seeds; own - reference "
              "paired by trial.")


ENGINE_INTRO = ("Every scored checkpoint was also scored by one reference evaluator, the same "
                f"for every arm (`{REF}`: verl's own validation of the checkpoint, run as a job "
                "of its own by one engine setting on one evaluation pool: {}; "
                "docs/evaluation.md). Own: the arm's own rollout engine (`eval/reward`: verl's "
                "validation through its engine, dtype and flags). Final values (the last scored "
                "checkpoint), mean [95% interval] over seeds; own - reference paired by trial.")


def intro(pool_kinds: frozenset[str], jobs: frozenset[str] = frozenset()) -> str:
    """What the section says the reference evaluator is: the simulator's, or verl's (cpu and gpu
    pools), or both where a grid's trials ran on both kinds; ``jobs``: the evaluators of scores
    made by evaluation jobs (``engine``), which the section names (more than one: it says the
    arms were not scored by one evaluator)."""
    if jobs:
        text = ENGINE_INTRO.format("; ".join(f"`{j}`" for j in sorted(jobs)))
        if len(jobs) > 1:
            text += (" Warning: these trials were scored by different evaluators, so the "
                     "reference is not one evaluator for every arm; run `ablate evaluate` with "
                     "one grid file over all of them.")
        return text
    verl = bool(pool_kinds & {"cpu", "gpu"})
    if verl and "sim" in pool_kinds:
        return f"{INTRO} On the verl pools: {VERL_INTRO}"
    return VERL_INTRO if verl else INTRO


def markdown(report: dict[str, Any], text: Callable[[str], str]) -> list[str]:
    """The section of ``summary.md`` (empty when no trial has a reference score)."""
    found = rows(report)
    if not found:
        return []
    lines = ["## Reference evaluation", "", report["reference_intro"], "",
             "| cell | own final | reference final | own - reference | disagree |",
             "|---|---|---|---|---|"]
    for label, s in found:
        lines.append(f"| {text(label)} | {_fmt(s['final_reward'], s['final_reward_lo'], s['final_reward_hi'])} | "
                     f"{_fmt(s['final_reward_ref'], s['final_reward_ref_lo'], s['final_reward_ref_hi'])} | "
                     f"{_fmt(s['own_minus_ref'], s['own_minus_ref_lo'], s['own_minus_ref_hi'])} | "
                     f"{'yes' if disagrees(s) else 'no'} |")
    return [*lines, "", *(text(x) for x in _summary_lines(found)), ""]


def html_section(report: dict[str, Any]) -> str:
    """The section of ``summary.html`` ("" when no trial has a reference score)."""
    found = rows(report)
    if not found:
        return ""
    esc = html.escape
    parts = ["<h2>Reference evaluation</h2>", f"<p>{esc(report['reference_intro'].replace('`', ''))}</p>",
             ("<table><tr><th>cell</th><th>own final</th><th>reference final</th>"
              "<th>own - reference</th><th>disagree</th></tr>")]
    for label, s in found:
        cells = [label, _fmt(s["final_reward"], s["final_reward_lo"], s["final_reward_hi"]),
                 _fmt(s["final_reward_ref"], s["final_reward_ref_lo"], s["final_reward_ref_hi"]),
                 _fmt(s["own_minus_ref"], s["own_minus_ref_lo"], s["own_minus_ref_hi"]),
                 "yes" if disagrees(s) else "no"]
        parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    parts.append("</table>" + "".join(f"<p>{esc(x)}</p>" for x in _summary_lines(found)))
    return "\n".join(parts)
