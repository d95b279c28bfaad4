"""What ``ablate compare`` reads: the grid's trial runs in MLflow, their curves and lineage.

One ``TrialResult`` per trial id (the newest active child run if a trial was tracked twice).
Curves come from MLflow's metric history: a resumed trial's run holds one value per step (a resume
from an earlier checkpoint replaces the run, see ``orchestrator/scheduler/_resume.py``; superseded runs are
soft-deleted and not read), so it reads as one continuous curve. Should a store still hold two
values for a step, the newest timestamp wins. Attempts come from the run's ``attempt.N.*`` tags,
or the trial directory's ``attempts.json`` when the tags are missing; the steps a resume replaced
(the collapse it rescued) come from the trial directory's ``superseded/attempt-N.jsonl``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import evaluation
from orchestrator import metrics as M
from orchestrator.compare._fetch import fetch_curves, summarised
from orchestrator.compare._runs import RunRecord, search_trial_runs
from orchestrator.cost import TrialCost, from_tags, trial_cost, with_reference
from orchestrator.exceptions import StateFileError
from orchestrator.store import TrialPaths, active_holder, read_json, records, summary
from orchestrator.store.records import iter_metrics, load_attempts
from orchestrator.store.reference import read_reference
from orchestrator.store.summary_table import LocalMetrics, agrees
from orchestrator.tracking import AXES_TAG, CONFIG_TAG, published_summaries
from orchestrator.trial import TrialState
from orchestrator.verdict import judge

CURVE_METRICS = summary.CURVE_METRICS
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Segment:
    """One attempt's step range and pool (for marking pool changes on curves)."""

    number: int
    pool: str
    start: int
    end: int | None


@dataclasses.dataclass
class TrialResult:
    trial_id: str
    run_id: str
    axes: dict[str, str]
    seed: int
    pool: str
    status: str
    verdict: str | None  # healthy | collapsed | unstable | numeric_failure | infra_failure | None
    verdict_step: int | None
    verdict_reason: str
    derived_from: str | None
    curves: dict[str, list[tuple[int, float]]]
    latest: dict[str, float]
    segments: list[Segment]
    superseded: list[dict[str, list[tuple[int, float]]]] = dataclasses.field(default_factory=list)
    numerics: dict[str, str] = dataclasses.field(default_factory=dict)  # ``numerics.*`` tags
    cost: TrialCost | None = None  # accelerator-hours (``cost.*`` tags, else attempts.json)
    # What sets the trial apart from the cell its axis labels name (an include point's own
    # keys, a derived trial's lineage, another config under the same labels): its own cell.
    variant: str = ""
    config: str = ""  # ``TrialSpec.config`` ("" for runs logged before it was tagged)
    # Exact final/peak values and last step of the full curves (the trial's summary, see
    # ``store.summary``): ``curves`` may be reduced for the plots.
    finals: dict[str, float] = dataclasses.field(default_factory=dict)
    peaks: dict[str, float] = dataclasses.field(default_factory=dict)
    steps_done: int | None = None
    rescue: dict[str, str] = dataclasses.field(default_factory=dict)  # ``rescue.*`` tags (``_rescues``)
    # Rules the trial's configuration gives no metric for, with why (``verdict.not_applicable``).
    not_applicable: dict[str, str] = dataclasses.field(default_factory=dict)
    # The evaluator of the scores ``ablate evaluate`` ran as jobs (``engine``), "" for none.
    reference_job: str = ""

    @property
    def reward_key(self) -> str:
        return M.EVAL_REWARD if self.curves.get(M.EVAL_REWARD) else M.TRAIN_REWARD

    @property
    def pools_run(self) -> str:
        """Its pool, or every pool it ran on in order (``sim-a100>sim-h100``) when an attempt
        moved it in place (a resume or rescue on another pool under the same id)."""
        pools = list(dict.fromkeys(s.pool for s in self.segments if s.pool))
        return ">".join(pools) if pools and pools != [self.pool] else self.pool

    def final(self, key: str) -> float:
        if key in self.finals:
            return self.finals[key]
        return summary.final_value(self.curves.get(key, []))

    def peak(self, key: str) -> float:
        if key in self.peaks:
            return self.peaks[key]
        return summary.peak_value(self.curves.get(key, []))

    @property
    def skipped_share(self) -> float:
        """An fp16 learner's share of skipped updates: the mean of ``fp16/skipped_share`` over
        its steps (NaN where the trial logs none: no loss scaler). From the curve, which is exact
        up to ``summary.MAX_POINTS`` steps and a min/max reduction beyond."""
        vals = [v for _, v in self.curves.get(M.SKIPPED_SHARE, []) if math.isfinite(v)]
        return sum(vals) / len(vals) if vals else math.nan

    @property
    def collapsed(self) -> bool | None:
        """True/False once judged; None when running or failed for infra reasons."""
        if self.verdict in (None, "infra_failure"):
            return None
        return self.verdict in ("collapsed", "numeric_failure")

    @property
    def last_step(self) -> int:
        if self.steps_done is not None:
            return self.steps_done
        return max((pts[-1][0] for pts in self.curves.values() if pts), default=0)


def newest_per_step(points: Sequence[Any]) -> list[tuple[int, float]]:
    """MLflow metric history -> one (step, value) per step, the newest timestamp winning."""
    best: dict[int, tuple[int, float]] = {}
    for p in points:
        prev = best.get(p.step)
        if prev is None or p.timestamp >= prev[0]:
            best[p.step] = (p.timestamp, float(p.value))
    return [(s, best[s][1]) for s in sorted(best)]


def segments_from_tags(tags: Mapping[str, str]) -> list[Segment]:
    out = []
    for key, pool in tags.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "attempt" and parts[2] == "pool" and parts[1].isdigit():
            lo, _, hi = tags.get(f"attempt.{parts[1]}.steps", "").partition("-")
            out.append(Segment(int(parts[1]), pool, int(lo or 1), int(hi) if hi else None))
    return sorted(out, key=lambda s: s.number)


def segments_from_dir(grid_dir: Path | None, trial_id: str) -> list[Segment]:
    if grid_dir is None:
        return []
    path = TrialPaths(grid_dir, trial_id).attempts
    if not path.exists():
        return []
    data = read_json(path)
    items = data.get("attempts", data) if isinstance(data, dict) else data
    return [Segment(int(a["number"]), str(a["pool"]), int(a["start_step"]),
                    None if a.get("end_step") is None else int(a["end_step"])) for a in items]


def cost_from_dir(grid_dir: Path | None, trial_id: str, steps: int) -> TrialCost | None:
    """A trial's cost from its ``attempts.json`` (a run logged before runs carried cost tags)."""
    if grid_dir is None or not TrialPaths(grid_dir, trial_id).attempts.exists():
        return None
    return trial_cost(load_attempts(TrialPaths(grid_dir, trial_id)), steps)


def superseded_tails(grid_dir: Path | None, trial_id: str) -> list[dict[str, list[tuple[int, float]]]]:
    """Curves of the steps each resume replaced, oldest first (drawn dashed by compare)."""
    if grid_dir is None:
        return []
    out = []
    files = (TrialPaths(grid_dir, trial_id).root / "superseded").glob("attempt-*.jsonl")
    for path in sorted(files, key=lambda p: int(p.stem.split("-")[1])):
        curves: dict[str, list[tuple[int, float]]] = {}
        for step, row in iter_metrics(path):
            for key in CURVE_METRICS:
                if key in row:
                    curves.setdefault(key, []).append((step, row[key]))
        out.append(curves)
    return out


def load_results(mlc: Any, experiment_id: str, axis_names: Sequence[str],
                 grid_dir: Path | None = None, fixed_pool: str | None = None, *,
                 local: LocalMetrics | None = None, tracking_uri: str = "", grid: str = "",
                 warnings: list[str] | None = None,
                 runs: Sequence[RunRecord] | None = None) -> list[TrialResult]:
    """The trial runs of one experiment as ``TrialResult`` (newest run per trial id), their
    curves from the workdir's summaries where it has them, else from the summary table of grid
    ``grid`` where it agrees with the run, else from MLflow (``_fetch``); ``warnings`` gets a
    line for a table that does not read back. ``runs``: the experiment's trial runs, newest
    first, when the caller has them (``_runs.listing``); else they are listed through ``mlc``."""
    local = LocalMetrics.read(grid_dir) if local is None else local
    seen: dict[str, TrialResult] = {}
    remote: dict[str, dict[str, int]] = {}  # run id -> curve metric -> points expected
    exact: dict[str, tuple[dict[str, float], dict[str, float], int]] = {}  # run id -> summary tags
    table: dict[str, summary.TrialSummary] | None = None  # downloaded when first needed
    tabled: dict[str, summary.TrialSummary] = {}  # trial id -> its agreeing table entry
    for run in (search_trial_runs(mlc, experiment_id) if runs is None else runs):
        tags, params = run.tags, run.params
        tid = tags.get("trial_id", "")
        if not tid or tid in seen or tid in local.unreadable:  # never filed into a cell
            continue
        curves: dict[str, list[tuple[int, float]]] = {}  # filled below, by source
        state = local.states.get(tid)
        if tid not in local.summaries and (state is None or state.is_finished()):
            if table is None:
                table, why = published_summaries(mlc, experiment_id, grid) if grid else ({}, "")
                if why and warnings is not None:
                    warnings.append(why)
            entry = table.get(tid)
            if entry is not None and agrees(entry, tags):
                tabled[tid] = entry
            else:
                tagged = summary.from_tags(tags)
                steps = int(params.get("steps", 0) or 0)
                if tagged and tags.get(f"{summary.TAG_PREFIX}last_step", "").isdigit():
                    exact[run.run_id] = (tagged[0], tagged[1],
                                              int(tags[f"{summary.TAG_PREFIX}last_step"]))
                remote[run.run_id] = {k: (tagged[2].get(k, steps) if tagged else steps)
                                           for k in CURVE_METRICS if k in run.metrics}
        axes, variant = trial_cell(tags, params, axis_names, grid_dir, tid, fixed_pool)
        step = tags.get("verdict.step", "")
        seen[tid] = TrialResult(
            trial_id=tid, run_id=run.run_id, axes=axes, seed=int(params.get("seed", tags.get("seed", 0))),
            pool=tags.get("pool", params.get("pool", "")), status=run.status,
            verdict=tags.get("verdict") or None, verdict_step=int(step) if step.isdigit() else None,
            verdict_reason=tags.get("verdict.reason", ""), derived_from=tags.get("derived_from") or None,
            curves=curves, latest=dict(run.metrics),
            segments=segments_from_tags(tags) or segments_from_dir(grid_dir, tid),
            superseded=superseded_tails(grid_dir, tid),
            numerics={k.removeprefix("numerics."): v for k, v in tags.items()
                      if k.startswith("numerics.")},
            cost=from_tags(tags) or cost_from_dir(grid_dir, tid, int(params.get("steps", 0) or 0)),
            variant=variant, config=tags.get(CONFIG_TAG, ""),
            rescue={k.removeprefix("rescue."): v for k, v in tags.items() if k.startswith("rescue.")},
            not_applicable=_not_applicable(tags.get("verdict.not_applicable", "")),
        )
    _fill_curves(mlc, tracking_uri, list(seen.values()), {**tabled, **local.summaries}, remote, exact)
    merge_reference(list(seen.values()), grid_dir)
    split_configs(seen.values(), axis_names)
    return sorted(seen.values(), key=lambda r: (tuple(r.axes.get(a, "") for a in axis_names),
                                                r.variant, r.seed, r.trial_id))


def _not_applicable(tag: str) -> dict[str, str]:
    try:
        data = json.loads(tag) if tag else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def not_applicable_lines(results: Sequence[TrialResult], text: Any) -> list[str]:
    """The Markdown lines naming each rule that did not run on some trials, and why: never
    run, so a healthy verdict there says nothing about it (``text``: ``markdown.text``)."""
    groups: dict[tuple[str, str], int] = {}
    for r in results:
        for rule, why in r.not_applicable.items():
            groups[(rule, why)] = groups.get((rule, why), 0) + 1
    if not groups:
        return []
    return ["", "Collapse rules not applicable (never run, so not passed either):", "",
            *(f"- {text(rule)} on {n} of {len(results)} trials: {text(why)}"
              for (rule, why), n in sorted(groups.items()))]


def trial_cell(tags: Mapping[str, str], params: Mapping[str, str], axis_names: Sequence[str],
               grid_dir: Path | None, trial_id: str,
               fixed_pool: str | None = None) -> tuple[dict[str, str], str]:
    """A trial's axis labels by the axes' own names, and its variant: the keys of its own
    axes that are not the grid's (an include point's, a derived trial's ``--set``; a derived
    trial also names its parent). From the run's ``ablate.axes`` tag, else the trial's
    ``spec.json``, else its params under MLflow's sanitised keys (``metrics.param_key``)."""
    own = _own_axes(tags, grid_dir, trial_id)
    if own is None:  # a run logged before the tag, compared without its workdir
        own = [(a, params[M.param_key(a)]) for a in axis_names if M.param_key(a) in params]
    values = dict(own)  # later entries win: a derived trial's --set over its parent's label
    axes = {a: values.get(a, "") for a in axis_names}
    extra = [(k, v) for k, v in values.items() if k not in axes and k not in ("seed", "steps")
             and not (k == "pool" and (fixed_pool is None or v == fixed_pool))]
    axes.update(extra)
    parts = [f"{k}={v}" for k, v in extra]
    if tags.get("derived_from"):
        parts.append(f"derived from {tags['derived_from']}")
    return axes, ", ".join(parts)


def _own_axes(tags: Mapping[str, str], grid_dir: Path | None, trial_id: str) -> list[tuple[str, str]] | None:
    text = tags.get(AXES_TAG)
    if text:
        try:
            return [(str(k), str(v)) for k, v in json.loads(text)]
        except (ValueError, TypeError):
            pass  # cut by the store's tag length: the trial's spec says the same
    if grid_dir is not None and TrialPaths(grid_dir, trial_id).spec.exists():
        spec = records.load_spec(TrialPaths(grid_dir, trial_id))
        if spec is not None:
            return list(spec.axes)
    return None


def split_configs(results: Iterable[TrialResult], axis_names: Sequence[str]) -> None:
    """Trials under the same labels but of different configurations (a grid extended with
    ``--extend`` after its pool's definition changed) are not seeds of one cell: each config
    gets its own variant."""
    groups: dict[tuple[Any, ...], list[TrialResult]] = {}
    for r in results:
        groups.setdefault((tuple(r.axes.get(a, "") for a in axis_names), r.variant), []).append(r)
    for members in groups.values():
        if len({r.config for r in members if r.config}) > 1:
            for r in members:
                r.variant = ", ".join(p for p in (r.variant, f"config {r.config or 'unknown'}") if p)


def _fill_curves(mlc: Any, uri: str, results: Sequence[TrialResult],
                 summaries: Mapping[str, summary.TrialSummary], remote: Mapping[str, Mapping[str, int]],
                 exact: Mapping[str, tuple[dict[str, float], dict[str, float], int]]) -> None:
    """Curves, final and peak values: from the trial's summary (on disk, or the table's entry),
    else from MLflow (in bulk), the final and peak values then from the run's ``summary.*`` tags
    when it has them (exact even when ``tracking.every`` sent MLflow a share of the steps). An
    unfinished trial on disk gets none: compare leaves it out."""
    fetched = fetch_curves(mlc, uri or mlc.tracking_uri, remote) if remote else {}
    for r in results:
        if r.trial_id in summaries:
            s = summaries[r.trial_id]
            r.curves, r.finals, r.peaks, r.steps_done = dict(s.curves), dict(s.final), dict(s.peak), s.last_step
        elif r.run_id in fetched:
            r.curves, r.finals, r.peaks = summarised(fetched[r.run_id])
            r.steps_done = max((pts[-1][0] for pts in fetched[r.run_id].values() if pts), default=0)
            if r.run_id in exact:
                final, peak, r.steps_done = exact[r.run_id]
                r.finals.update(final)
                r.peaks.update(peak)


def merge_reference(results: Sequence[TrialResult], grid_dir: Path | None) -> None:
    """Add the reference scores ``ablate evaluate`` made after the fact (``store.reference``)
    to the trials' ``eval/reward_ref`` curves (a step the trial logged itself keeps its value;
    without the workdir the same scores come from MLflow with the other curves), and the
    reference evaluator's time to their cost: ``timing_s/eval_ref`` summed over the trial's
    curve (exact up to ``summary.MAX_POINTS`` reference evaluations) plus that scoring's."""
    for r in results:
        held = None
        if grid_dir is not None:
            try:
                held = read_reference(TrialPaths(grid_dir, r.trial_id))
            except StateFileError as exc:
                log.warning("%s", exc)
        in_trial = sum(v for _, v in r.curves.get(M.TIME_EVAL_REF, []) if math.isfinite(v))
        r.cost = with_reference(r.cost, in_trial, held.seconds if held else 0.0,
                                held.rate if held else None)
        if held is None or not held.scores:
            continue
        if held.target not in evaluation.IN_RUN_TARGETS:
            r.reference_job = held.evaluator
        have = dict(r.curves.get(M.EVAL_REWARD_REF, []))
        merged = sorted({**{s: v for s, (v, _) in held.scores.items()}, **have}.items())
        r.curves[M.EVAL_REWARD_REF] = merged
        r.finals[M.EVAL_REWARD_REF] = summary.final_value(merged)
        r.peaks[M.EVAL_REWARD_REF] = summary.peak_value(merged)


def judge_missing(results: Sequence[TrialResult], collapse: Any, steps: int) -> None:
    """Give trials without a recorded verdict (e.g. still running) one from their curves."""
    for r in results:
        if r.verdict is not None or not r.curves:
            continue
        rows: dict[int, dict[str, float]] = {}
        for key, pts in r.curves.items():
            for s, v in pts:
                rows.setdefault(s, {})[key] = v
        history = sorted(rows.items())
        outcome = "completed" if history and history[-1][0] >= steps else "stopped"
        v = judge(history, collapse, total_steps=steps, outcome=outcome)
        r.verdict, r.verdict_step = v.kind.value, v.step
        r.verdict_reason = v.reason + " (judged by compare from the curves)"


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """The trials of a grid that have not finished, by their records on disk."""

    running: int
    queued: int
    active: bool  # a submission is running the grid now
    unsent: int = 0  # finished by their records, not (yet) in MLflow: the outbox sends them

    def __bool__(self) -> bool:
        return self.running + self.queued + self.unsent > 0

    def describe(self) -> str:
        n = self.running + self.queued + self.unsent
        trials = f"{n} trial{'' if n == 1 else 's'}"
        counts = f"{self.running} running, {self.queued} queued"
        if self.unsent:
            counts += f", {self.unsent} finished but not in MLflow yet"
        if self.active:
            return f"{trials} still running ({counts})"
        return (f"{trials} unfinished ({counts}) and no submission runs them; `ablate submit` "
                "continues them")


def split_unfinished(results: Sequence[TrialResult], grid_dir: Path | None, *,
                     states: Mapping[str, TrialState] | None = None) -> tuple[list[TrialResult], Unfinished]:
    """The results of finished trials, and what is still to come. A trial's record on disk
    (``states``, read from ``grid_dir`` unless given) decides; a run the workdir does not know
    (compare on another machine) counts as finished unless MLflow still has it RUNNING without
    a verdict."""
    if states is not None:
        states = dict(states)
    else:
        states = {}
        if grid_dir is not None and Path(grid_dir).is_dir():
            for tid in records.trial_ids(grid_dir):
                try:
                    states[tid] = records.load_state(TrialPaths(grid_dir, tid), tid).state
                except StateFileError:
                    continue  # left out of the tables (``LocalMetrics.unreadable``)
    done = []
    sent = {r.trial_id for r in results}
    for r in results:
        state = states.get(r.trial_id)
        if state is None and r.status == "RUNNING" and r.verdict is None:
            state = TrialState.RUNNING
        if state is None or state.is_finished():
            done.append(r)
        else:
            states.setdefault(r.trial_id, state)
    running = sum(s is TrialState.RUNNING for s in states.values())
    queued = sum(s is TrialState.PENDING for s in states.values())
    # A trial that finished a moment ago may not have reached MLflow (its outbox sends it): it
    # is neither in the tables nor running, and must not drop out of the counts unsaid.
    unsent = sum(s is TrialState.DONE and tid not in sent for tid, s in states.items())
    active = grid_dir is not None and active_holder(Path(grid_dir)) is not None
    return done, Unfinished(running, queued, active, unsent)
