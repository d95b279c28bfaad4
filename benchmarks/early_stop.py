"""Early stop on a grid with real collapses: compute saved, healthy trials wrongly stopped, and
agreement of the early verdicts with the full-run verdicts.

Every trial of the grid runs to its end on the CPU simulator (``SimBackend`` in this process,
early stop off) and its metric history is cached as JSON. The full-run verdict is judged on the
whole history. Early stop is then replayed on the same history with ``VerdictEngine`` exactly as
the runner drives it (``observe`` per step, stop at the first reason). That gives the same stop
step a live run would get, because the engine only sees the prefix and is deterministic. For
each early-stop setting the script reports:

- saved: the share of all trial-steps the stopped trials did not run (goal >= 30%),
- wrongly stopped: stopped trials whose full run ended healthy or unstable (goal 0),
- agreement: the early verdict kind equals the full-run kind (goal >= 95%),
- lead time of the mismatch early warning before the collapse.

    .venv/bin/python benchmarks/early_stop.py [--grid benchmarks/early_stop_grid.yaml] [--cache DIR]
    .venv/bin/python benchmarks/early_stop.py --synthetic   # recorded synthetic streams, no sim
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

History = list[tuple[int, dict[str, float]]]
REPO = Path(__file__).resolve().parent.parent
SETTINGS = [  # (label, margin, on_warning); margin 20 is the default
    ("margin 0", 0, False), ("margin 5", 5, False), ("margin 10", 10, False), ("margin 20", 20, False),
    ("margin 40", 40, False), ("warning + 10", 10, True), ("warning + 30", 30, True),
]


def run_sim_grid(grid_file: Path, cache: Path) -> list[tuple[str, int, History, str]]:
    """(trial id, total steps, full history, label) per trial; cached by trial id."""
    from orchestrator.backends.sim import SimBackend
    from orchestrator.grid import expand, load_grid
    from orchestrator.sim.local import LocalContext

    grid = load_grid(grid_file)
    out = []
    cache.mkdir(parents=True, exist_ok=True)
    trials = expand(grid)
    for i, t in enumerate(trials, 1):
        path = cache / f"{t.trial_id}.json"
        label = ", ".join(f"{k}={v}" for k, v in t.axes) + f", seed={t.seed}"
        if not path.exists():
            t0 = time.time()
            ctx = LocalContext(trial=t, pool=grid.pools.get(t.pool), workdir=cache / "work" / t.trial_id)
            result = SimBackend().run(t, grid.trial_config(t), ctx)
            path.write_text(json.dumps({"outcome": result.outcome.value, "label": label,
                                        "history": sorted(ctx.metrics.items())}))
            print(f"  [{i}/{len(trials)}] {label}: {result.outcome.value} at step {result.last_step} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        data = json.loads(path.read_text())
        out.append((t.trial_id, t.steps, [(int(s), m) for s, m in data["history"]], label))
    return out


def recorded_trials(trials_dir: Path) -> list[tuple[str, int, History, str]]:
    """Finished trials the runner recorded (``<workdir>/<grid>/trials/*/``) that ran to their
    last step, i.e. were not stopped early (their full history is known)."""
    from orchestrator import records
    from orchestrator.trial import TrialPaths, TrialSpec, read_json

    out = []
    for root in sorted(p for p in trials_dir.iterdir() if (p / "spec.json").exists()):
        paths = TrialPaths(trials_dir.parent, root.name)
        spec = TrialSpec.from_json(read_json(paths.spec))
        hist = list(records.iter_metrics(paths.metrics))
        if hist and hist[-1][0] >= spec.steps:
            label = ", ".join(f"{k}={v}" for k, v in spec.axes) + f", seed={spec.seed} (recorded)"
            out.append((spec.trial_id, spec.steps, hist, label))
    return out


def synthetic_streams() -> list[tuple[str, int, History, str]]:
    """Recorded synthetic streams (tests/verdict_streams.py) when no simulator grid is used."""
    sys.path.insert(0, str(REPO / "tests"))
    import verdict_streams as V

    makers = {"explosion": V.explosion, "slow_collapse": V.slow_collapse, "dip_and_recover": V.dip_and_recover,
              "healthy": V.healthy, "noisy_healthy": V.noisy_healthy, "slow_drift_healthy": V.slow_drift_healthy}
    return [(f"{name}-{seed}", 300, fn(seed=seed), f"{name} seed={seed}")
            for name, fn in makers.items() for seed in range(10)]


def replay(history: History, total: int, collapse: object, early: object) -> tuple[object, int | None]:
    """The verdict a live run with this early-stop setting would end with, and its stop step."""
    from orchestrator.verdict import VerdictEngine

    engine = VerdictEngine(collapse, early, total)  # type: ignore[arg-type]
    for step, row in history:
        reason = engine.observe(step, row)
        if reason:
            return engine.verdict(step, "stopped", reason), step
    last = history[-1][0] if history else 0
    return engine.verdict(last, "completed" if last >= total else "numeric_failure"), None


def evaluate(trials: Sequence[tuple[str, int, History, str]], collapse: object) -> dict[str, object]:
    from orchestrator.schema import EarlyStopSpec
    from orchestrator.verdict import VerdictKind, judge

    full = {}
    for tid, total, hist, _ in trials:
        last = hist[-1][0] if hist else 0
        full[tid] = judge(hist, collapse, total_steps=total,  # type: ignore[arg-type]
                          outcome="completed" if last >= total else "numeric_failure")
    kinds: dict[str, int] = {}
    for v in full.values():
        kinds[v.kind.value] = kinds.get(v.kind.value, 0) + 1
    total_steps = sum(t[1] for t in trials)
    rows = []
    bad_kinds = (VerdictKind.HEALTHY, VerdictKind.UNSTABLE)
    for label, margin, on_warning in SETTINGS:
        early = EarlyStopSpec(enabled=True, margin=margin, on_warning=on_warning)
        saved = wrong = wrong_healthy = agree = stopped = 0
        wrong_ids = []
        for tid, total, hist, name in trials:
            v, at = replay(hist, total, collapse, early)
            ref = full[tid]
            if at is not None:
                stopped += 1
                saved += total - at
                if ref.kind in bad_kinds:
                    wrong += 1
                    wrong_healthy += ref.kind is VerdictKind.HEALTHY
                    wrong_ids.append(f"{name} [{ref.kind.value}]")
            # A trial stopped on a warning alone has no collapse yet; it "predicts" a collapse.
            early_kind = VerdictKind.COLLAPSED if at is not None and v.kind in bad_kinds else v.kind
            agree += early_kind is ref.kind
        rows.append({"setting": label, "stopped": stopped, "saved_share": saved / total_steps,
                     "wrongly_stopped": wrong, "healthy_stopped": wrong_healthy,
                     "wrongly_stopped_trials": wrong_ids,
                     "agreement": agree / len(trials)})
    leads = [v.lead_time for v in full.values() if v.kind is VerdictKind.COLLAPSED and v.lead_time is not None]
    return {"trials": len(trials), "trial_steps": total_steps, "full_run_verdicts": kinds,
            "collapsed_with_warning": len(leads),
            "lead_time_median": statistics.median(leads) if leads else None,
            "lead_time_range": [min(leads), max(leads)] if leads else None,
            "ideal_saved_share": sum(t[1] - (full[t[0]].step or t[1]) for t in trials
                                     if full[t[0]].kind is VerdictKind.COLLAPSED) / total_steps,
            "settings": rows}


def report(res: Mapping[str, object], source: str) -> None:
    print(f"\n{source}: {res['trials']} trials, {res['trial_steps']} trial-steps; "
          f"full-run verdicts {res['full_run_verdicts']}")
    print(f"collapses with an early warning: {res['collapsed_with_warning']}, lead time median "
          f"{res['lead_time_median']} steps, range {res['lead_time_range']}; "
          f"steps after collapse onsets (upper bound on savings): {res['ideal_saved_share']:.1%}")
    print("wrongly stopped = stopped, but the full run ended healthy or unstable (recovered)")
    print(f"{'setting':<14}{'stopped':>8}{'saved':>9}{'wrongly stopped':>17}{'of them healthy':>17}"
          f"{'agreement':>11}")
    for r in res["settings"]:  # type: ignore[attr-defined]
        print(f"{r['setting']:<14}{r['stopped']:>8}{r['saved_share']:>9.1%}{r['wrongly_stopped']:>17}"
              f"{r['healthy_stopped']:>17}{r['agreement']:>11.1%}")
        if r["wrongly_stopped_trials"]:
            print(f"{'':14}wrongly stopped: {', '.join(r['wrongly_stopped_trials'][:6])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=REPO / "benchmarks" / "early_stop_grid.yaml")
    ap.add_argument("--cache", type=Path, default=REPO / ".ablate" / "bench-early-stop")
    ap.add_argument("--synthetic", action="store_true", help="recorded synthetic streams instead of the sim")
    ap.add_argument("--trials-dir", type=Path, action="append", default=[],
                    help="also use finished, not early-stopped trials the runner recorded here "
                         "(e.g. .ablate/quickstart/trials)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from orchestrator.schema import CollapseSpec

    if args.synthetic:
        trials, source, collapse = synthetic_streams(), "synthetic streams (tests/verdict_streams.py)", CollapseSpec()
    else:
        from orchestrator.grid import load_grid

        collapse = load_grid(args.grid).spec.collapse
        trials, source = run_sim_grid(args.grid, args.cache), f"sim grid {args.grid.name}"
    for d in args.trials_dir:
        extra = recorded_trials(d)
        trials += extra
        source += f" + {len(extra)} recorded sim trials from {d}"
    res = evaluate(trials, collapse)
    report(res, source)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"source": source, **res}, indent=1, default=str))


if __name__ == "__main__":
    main()
