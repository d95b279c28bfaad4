"""A probe's files: ``probe.md`` (the tables, the gates, what a probe cannot see), ``probe.csv``
(one row per configuration, every figure with its interval), ``probe_attribution.csv`` and the
plots ``probe_k3.png`` (k3 per configuration) and ``probe_attribution.png`` (the knobs' bars).

Wall times are in their own columns and ``- time`` lines: they are the only figures that differ
between two runs of the same code (``tests/probe`` compares the rest with the committed files).
"""
from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.grid import Gate
from orchestrator.probe._plan import METRICS, Plan
from orchestrator.probe._summary import Summary
from orchestrator.stats.intervals import Interval

TIME_COLUMNS = ("wall_s", "wall_s_lo", "wall_s_hi", "job_seconds", "attribution_seconds",
                "accelerator_hours")
CAVEAT = ("A probe measures the mismatch of each configuration at its first step, with the "
          "initial weights and no update. It does not predict mismatch that grows during "
          "training (seed 001 saw k3 rise after step 600; the quickstart's sim-h100 trials reach "
          "a k3 far above their step-1 value), nor the effect of weights that drift apart "
          "through staleness: at step 1 the engine and the trainer hold the same weights, so "
          "the attribution measures the weight-lag knob after `lag` real updates instead.")


def _g(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3g}"


def _iv(i: Interval) -> str:
    if not math.isfinite(i.estimate):
        return "n/a"
    if not (math.isfinite(i.low) and math.isfinite(i.high)):
        return _g(i.estimate)
    return f"{_g(i.estimate)} [{_g(i.low)}, {_g(i.high)}]"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _below_resolution(summaries: Sequence[Summary]) -> list[str]:
    """A k3 of exactly 0 whose tokens still differ: the trainer's arithmetic (verl computes k3
    in the log-probs' float32) rounds a mismatch of a few ULPs to 0; the bucket table's k3
    (float64) shows it."""
    out = [f"- {s.label}: k3 is 0 as the trainer computes it, yet "
           f"{1 - s.metrics['bitwise_share'].estimate:.1%} of the tokens' log-probs are not "
           f"bitwise equal (max |dlogp| {_g(s.metrics['abs_diff_max'].estimate)}): a mismatch "
           "below what that k3 resolves, not none"
           for s in summaries if s.metrics["k3"].estimate == 0
           and s.metrics["bitwise_share"].estimate < 1]
    return ["", *out] if out else []


def markdown(plan: Plan, summaries: Sequence[Summary], gates: Sequence[Gate]) -> str:
    """``probe.md``."""
    g = plan.grid
    lines = [f"# Probe of grid `{g.name}`", "",
             (f"From `{g.file}`: {len(summaries)} configuration(s) that decide mismatch, each "
             f"probed over seeds {', '.join(map(str, plan.seeds))} x {plan.batches} batches "
             "(batch b of seed s is step b of that seed's trial, no update); every figure is "
             "the mean over those batches with its 95% t interval."), "", CAVEAT, "",
             "## Mismatch per configuration", ""]
    lines += _table(("configuration", "probe", "trials", "k3", "k1", "max abs dlogp",
                     "p99 abs dlogp", "bitwise equal", "chi2", "tokens"),
                    [(s.label, f"`{s.measured.config.probe_id}`", str(len(s.measured.config.trials)),
                      _iv(s.metrics["k3"]), _iv(s.metrics["k1"]), _iv(s.metrics["abs_diff_max"]),
                      _iv(s.metrics["abs_diff_p99"]), _iv(s.metrics["bitwise_share"]),
                      _iv(s.metrics["chi2"]), str(s.tokens)) for s in summaries])
    lines += _below_resolution(summaries)
    if gates:
        lines += ["", "## Gates", "", f"Bounds: {', '.join(map(str, gates))}.", ""]
        lines += [f"- {s.label}: " + ("over " + ", ".join(
            f"{x} ({_iv(s.metrics[x.metric])})" for x in s.failed) if s.failed else "within")
            for s in summaries]
    if plan.refused:
        lines += ["", "## Not probed", ""] + [f"- {label}: {why}" for label, why in plan.refused]
    if summaries:
        lines += ["", "## k3 by rollout probability of the sampled token", ""]
        lines += _table(("bucket", *(s.label for s in summaries)),
                        [(b, *(f"{_iv(s.buckets[i][1])} (share {_g(s.buckets[i][2].estimate)})"
                               for s in summaries))
                         for i, (b, _, _) in enumerate(summaries[0].buckets)])
    if any(s.attribution for s in summaries):
        lines += ["", ("## Attribution: the k3 each knob accounts for (the configuration's k3 "
                  "minus its k3 with that knob set as the fp32 trainer computes; a negative "
                  "value: the change raises k3)"), ""]
        for s in summaries:
            lines += [f"### {s.label}", ""]
            if not s.attribution:
                lines += ["No knob: this configuration computes as the fp32 trainer does.", ""]
                continue
            lines += _table(("rank", "knob", "change", "k3 it accounts for"),
                            [(str(i), a.knob, a.change, _iv(a.delta))
                             for i, a in enumerate(s.attribution, 1)])
            lines.append("")
    lines += ["", "## Engine settings the engine applied", ""]
    for s in summaries:
        settings = ", ".join(f"{k}={v}" for k, v in sorted(s.measured.engine.items())
                             if not k.startswith("numerics."))
        lines.append(f"- {s.label}: {settings}")
    lines += [""] + [f"- time {s.label}: {_g(s.measured.seconds)} s for the probe job "
                     f"({_iv(s.metrics['wall_s'])} s per batch), {_g(s.measured.knob_seconds)} s "
                     f"for its knobs: {_g(s.measured.cost[0])} {s.measured.cost[1]}"
                     for s in summaries]
    return "\n".join(lines).rstrip() + "\n"


def _flat(i: Interval, name: str) -> dict[str, Any]:
    return {name: i.estimate, f"{name}_lo": i.low, f"{name}_hi": i.high}


def write(out: Path, plan: Plan, summaries: Sequence[Summary], gates: Sequence[Gate]) -> list[Path]:
    """Write the probe's files into ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "probe.md", out / "probe.csv"]
    files[0].write_text(markdown(plan, summaries, gates))
    rows = []
    for s in summaries:
        row: dict[str, Any] = {"configuration": s.label, "probe_id": s.measured.config.probe_id,
                               "pool": s.measured.config.pool.name,
                               "trials": " ".join(s.measured.config.trials),
                               "seeds": " ".join(map(str, plan.seeds)), "batches": plan.batches,
                               "total_tokens": s.tokens, "job_seconds": s.measured.seconds,
                               "attribution_seconds": s.measured.knob_seconds,
                               "accelerator_hours": s.measured.cost[0],
                               "hours_unit": s.measured.cost[1],
                               "gate_failed": " ".join(map(str, s.failed))}
        for name in METRICS:
            row.update(_flat(s.metrics[name], name))
        for bucket, k3, share in s.buckets:
            row.update(_flat(k3, f"k3_p_{bucket}"))
            row[f"share_p_{bucket}"] = share.estimate
        rows.append(row)
    _csv(files[1], rows)
    if any(s.attribution for s in summaries):
        files.append(out / "probe_attribution.csv")
        _csv(files[-1], [{"configuration": s.label, "rank": i, "knob": a.knob,
                          "change": a.change, **_flat(a.delta, "k3_change")}
                         for s in summaries for i, a in enumerate(s.attribution, 1)])
    files += _plots(out, summaries)
    return files


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["configuration"])
        w.writeheader()
        w.writerows({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()}
                    for r in rows)


def _err(i: Interval) -> tuple[float, float]:
    ok = math.isfinite(i.low) and math.isfinite(i.high)
    return (i.estimate - i.low, i.high - i.estimate) if ok else (0.0, 0.0)


def _plots(out: Path, summaries: Sequence[Summary]) -> list[Path]:
    import matplotlib  # deferred: only where the files are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [out / "probe_k3.png"]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(summaries) + 2), 3.5))
    k3 = [s.metrics["k3"] for s in summaries]
    err = list(zip(*(_err(i) for i in k3))) or [[], []]
    ax.errorbar(range(len(k3)), [i.estimate for i in k3], yerr=err, fmt="o", capsize=4)
    ax.set_xticks(range(len(k3)), [s.label for s in summaries], rotation=20, ha="right")
    if all(i.estimate > 0 for i in k3) and k3:
        ax.set_yscale("log")
    ax.set_ylabel("k3 at step 1 (95% interval)")
    ax.set_title("probe: mismatch per configuration")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    with_knobs = [s for s in summaries if s.attribution]
    if with_knobs:
        paths.append(out / "probe_attribution.png")
        fig, axes = plt.subplots(len(with_knobs), 1, squeeze=False,
                                 figsize=(7, 1.2 + 0.45 * sum(len(s.attribution) for s in with_knobs)))
        for ax, s in zip(axes[:, 0], with_knobs):
            bars = list(reversed(s.attribution))
            xerr = list(zip(*(_err(a.delta) for a in bars)))
            ax.barh(range(len(bars)), [a.delta.estimate for a in bars], xerr=xerr, capsize=3)
            ax.set_yticks(range(len(bars)), [f"{a.knob} {a.change}" for a in bars], fontsize=8)
            ax.set_xscale("symlog", linthresh=1e-6)
            ax.set_title(f"{s.label}: k3 removed by each knob", fontsize=9)
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
