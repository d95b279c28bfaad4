"""Early stop on a grid with real collapses: compute saved, healthy trials wrongly stopped, and
agreement of the early verdicts with the full-run verdicts.

Every trial of the grid runs to its end on the CPU simulator (``SimTrainer`` in this process,
early stop off) and its metric history is cached as JSON. The full-run verdict is judged on the
whole history. Early stop is then replayed on the same history with ``VerdictEngine`` exactly as
the runner drives it (``observe`` per step, stop at the first reason). That gives the same stop
step a live run would get, because the engine only sees the prefix and is deterministic. For
each early-stop setting the script reports:

- saved: the share of all trial-steps the stopped trials did not run (goal >= 30%),
- wrongly stopped: stopped trials whose full run ended healthy or unstable (goal 0),
- agreement: the early verdict kind equals the full-run kind (goal >= 95%),
- lead time of the mismatch early warning before the collapse.

It also prints the most any policy could save without stopping a trial that recovers (every
trial that ends collapsed stopped at step 1), and explored stop conditions ([x]: reward-confirmed,
several rules at once, relapse, warning plus a fired rule) replayed on the same engine state.

    .venv/bin/python benchmarks/early_stop.py [--grid benchmarks/early_stop_grid.yaml] [--cache DIR]
    .venv/bin/python benchmarks/early_stop.py --seeds 1,2     # a held-out seed set of the same grid
    .venv/bin/python benchmarks/early_stop.py --history-dir DIR  # cached histories as recorded
    .venv/bin/python benchmarks/early_stop.py --recorded-only --trials-dir .ablate-findings/findings/trials
    .venv/bin/python benchmarks/early_stop.py --synthetic   # recorded synthetic streams, no sim

The simulator's code changes the histories (and the trial ids, so the cache misses): compare
policies on one cached set (``--history-dir``), not across simulator versions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

History = list[tuple[int, dict[str, float]]]
REPO = Path(__file__).resolve().parent.parent
SETTINGS = [  # (label, margin, on_warning); margin 20 is the default
    ("margin 0", 0, False), ("margin 5", 5, False), ("margin 10", 10, False), ("margin 20", 20, False),
    ("margin 40", 40, False), ("warning + 10", 10, True), ("warning + 30", 30, True),
]


def run_sim_grid(grid_file: Path, cache: Path) -> list[tuple[str, int, History, str]]:
    """(trial id, total steps, full history, label) per trial; cached by trial id."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.sim.job import SimTrainer
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
            result = SimTrainer().run(t, grid.trial_config(t), ctx)
            path.write_text(json.dumps({"outcome": result.outcome.value, "label": label, "steps": t.steps,
                                        "history": sorted(ctx.metrics.items())}))
            print(f"  [{i}/{len(trials)}] {label}: {result.outcome.value} at step {result.last_step} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        data = json.loads(path.read_text())
        out.append((t.trial_id, t.steps, [(int(s), m) for s, m in data["history"]], label))
    return out


def cached_histories(directory: Path, steps: int) -> list[tuple[str, int, History, str]]:
    """Every history ``run_sim_grid`` cached in ``directory`` (``<trial id>.json``), judged as
    recorded, without simulating: a fixed trial set while the simulator's code moves on."""
    out = []
    for path in sorted(directory.glob("t*.json")):
        data = json.loads(path.read_text())
        out.append((path.stem, int(data.get("steps", steps)), [(int(s), m) for s, m in data["history"]],
                    data["label"]))
    if not out:
        raise SystemExit(f"--history-dir {directory}: no cached trial histories (t*.json) there; "
                         "fix: point it at a --cache directory of an earlier run")
    return out


def with_seeds(grid_file: Path, seeds: str, cache: Path) -> Path:
    """A copy of ``grid_file`` (in ``cache``) whose ``seeds:`` are ``seeds``, e.g. a held-out set."""
    import yaml

    try:
        values = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds {seeds!r}: expected comma-separated integers, e.g. --seeds 1,2") from None
    data = yaml.safe_load(grid_file.read_text())
    data["seeds"] = values
    out = cache / f"{grid_file.stem}-seeds-{'-'.join(map(str, values))}.yaml"
    cache.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def recorded_trials(trials_dir: Path) -> list[tuple[str, int, History, str]]:
    """Finished trials the runner recorded (``<workdir>/<grid>/trials/*/``) that ran to their
    last step, i.e. were not stopped early (their full history is known)."""
    from orchestrator.store import TrialPaths, read_json, records
    from orchestrator.trial import TrialSpec

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


def replay(history: History, total: int, collapse: object, early: object,
           policy: Policy | None = None) -> tuple[object, int | None]:
    """The verdict a live run with this early-stop setting would end with, and its stop step.
    ``policy``: an explored stop condition on the engine's state instead of ``early``'s."""
    from orchestrator.schema import EarlyStopSpec
    from orchestrator.verdict import VerdictEngine

    engine = VerdictEngine(collapse, EarlyStopSpec(enabled=False) if policy else early, total)  # type: ignore[arg-type]
    for step, row in history:
        reason = engine.observe(step, row)
        if policy is not None and policy(engine):
            return engine.verdict(step, "completed"), step  # the kind it would have been stopped with
        if reason:
            return engine.verdict(step, "stopped", reason), step
    last = history[-1][0] if history else 0
    return engine.verdict(last, "completed" if last >= total else "numeric_failure"), None


Policy = Callable[[Any], bool]
REWARD_RULES = ("train_reward_drop", "eval_reward_drop")


def _held(engine: Any, m: int, names: tuple[str, ...] | None = None, relapse: bool = False) -> list[Any]:
    """Collapse rules firing now that have held for the last ``m`` observations."""
    return [r for r in engine.rules
            if r.firing is not None and r.spec.kind != "nonfinite" and r.spec.verdict == "collapsed"
            and r.firing.held(m)
            and (names is None or r.spec.name in names) and (not relapse or r.episodes)]


# Stop conditions explored against the default (a fired collapse rule held ``margin`` more
# observations). Not grid settings: replays of the same engine, to see whether any of these real
# signals separates collapses that stay from those that recover better than the margin does.
EXPLORED: list[tuple[str, Policy]] = [
    ("reward held 10", lambda e: bool(_held(e, 10, REWARD_RULES))),
    ("reward held 20", lambda e: bool(_held(e, 20, REWARD_RULES))),
    ("2 rules held 0", lambda e: len(_held(e, 0)) >= 2),
    ("2 rules held 10", lambda e: len(_held(e, 10)) >= 2),
    ("3 rules held 0", lambda e: len(_held(e, 0)) >= 3),
    ("relapse held 0", lambda e: bool(_held(e, 0, relapse=True))),
    ("relapse held 10", lambda e: bool(_held(e, 10, relapse=True))),
    ("warning + rule 10", lambda e: e.warning_step is not None and bool(_held(e, 10))),
]


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
    runs: list[tuple[str, object, Policy | None]] = [
        (label, EarlyStopSpec(enabled=True, margin=margin, on_warning=on_warning), None)
        for label, margin, on_warning in SETTINGS]
    runs += [(f"[x] {label}", None, policy) for label, policy in EXPLORED]
    for label, early, policy in runs:
        saved = wrong = wrong_healthy = agree = stopped = 0
        wrong_ids = []
        for tid, total, hist, name in trials:
            v, at = replay(hist, total, collapse, early, policy)
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
            # Stopping every trial that ends collapsed at its first step and nothing else: no
            # policy that stops only collapsing trials can save more on this trial set.
            "upper_bound_saved_share": sum(t[1] for t in trials
                                           if full[t[0]].kind is VerdictKind.COLLAPSED) / total_steps,
            "settings": rows,
            "full_run": [{"trial": tid, "label": name, "verdict": full[tid].kind.value, "step": full[tid].step,
                          "rule": full[tid].rule} for tid, _, _, name in trials]}


def report(res: Mapping[str, object], source: str) -> None:
    print(f"\n{source}: {res['trials']} trials, {res['trial_steps']} trial-steps; "
          f"full-run verdicts {res['full_run_verdicts']}")
    print(f"collapses with an early warning: {res['collapsed_with_warning']}, lead time median "
          f"{res['lead_time_median']} steps, range {res['lead_time_range']}; "
          f"steps after collapse onsets: {res['ideal_saved_share']:.1%}; all steps of the trials "
          f"that end collapsed (upper bound without stopping a recovering trial): "
          f"{res['upper_bound_saved_share']:.1%}")
    print("[x] = explored stop condition (a replay of the engine's state, not a grid setting)")
    print("wrongly stopped = stopped, but the full run ended healthy or unstable (recovered)")
    print(f"{'setting':<22}{'stopped':>8}{'saved':>9}{'wrongly stopped':>17}{'of them healthy':>17}"
          f"{'agreement':>11}")
    for r in res["settings"]:  # type: ignore[attr-defined]
        print(f"{r['setting']:<22}{r['stopped']:>8}{r['saved_share']:>9.1%}{r['wrongly_stopped']:>17}"
              f"{r['healthy_stopped']:>17}{r['agreement']:>11.1%}")
        if r["wrongly_stopped_trials"]:
            print(f"{'':22}wrongly stopped: {', '.join(r['wrongly_stopped_trials'][:6])}")


def main() -> None:
    from orchestrator.sim import numerics

    numerics.ensure_pinned()  # figures hold on every x86-64 AVX2 machine only pinned
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=REPO / "benchmarks" / "early_stop_grid.yaml")
    ap.add_argument("--cache", type=Path, default=REPO / ".ablate" / "bench-early-stop")
    ap.add_argument("--synthetic", action="store_true", help="recorded synthetic streams instead of the sim")
    ap.add_argument("--seeds", help="comma-separated seeds replacing the grid's (a held-out set, e.g. 1,2)")
    ap.add_argument("--history-dir", type=Path,
                    help="judge the histories cached here as they are instead of simulating the grid")
    ap.add_argument("--trials-dir", type=Path, action="append", default=[],
                    help="also use finished, not early-stopped trials the runner recorded here "
                         "(e.g. .ablate/quickstart/trials)")
    ap.add_argument("--recorded-only", action="store_true",
                    help="judge only the --trials-dir trials (no grid simulated or cached)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from orchestrator.schema import CollapseSpec

    if args.synthetic:
        trials, source, collapse = synthetic_streams(), "synthetic streams (tests/verdict_streams.py)", CollapseSpec()
    else:
        from orchestrator.grid import load_grid

        grid_file = with_seeds(args.grid, args.seeds, args.cache) if args.seeds else args.grid
        grid = load_grid(grid_file)
        collapse = grid.spec.collapse
        if args.recorded_only:
            trials, source = [], "no grid"
        elif args.history_dir:
            trials = cached_histories(args.history_dir, grid.spec.steps)
            source = f"{len(trials)} sim trials of {args.grid.name} cached in {args.history_dir}"
        else:
            trials, source = run_sim_grid(grid_file, args.cache), f"sim grid {grid_file.name}"
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
