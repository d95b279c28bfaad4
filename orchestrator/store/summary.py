"""A finished trial's summary and the validation stamp of its ``metrics.jsonl``, written once by
the runner at the trial's end, so readers of large grids do not parse every metrics file again.

- The **stamp** (``Stamp``; in ``state.json`` as ``metrics_stamp`` and in ``summary.json``) is
  the file's size and mtime when the trial ended, with what the one check at that moment found
  (complete steps, unreadable lines). While the file's size and mtime are unchanged, the check
  is the stamp: ``ablate status`` compares file stats instead of parsing. Any change to the file
  (a resume, a repair, an edit) changes them, and the reader checks the file in full again.
- The **summary** (``TrialSummary``, ``trials/<id>/summary.json``): per curve metric
  (``CURVE_METRICS``) the final and peak values (last finite, max finite: the rules of
  ``compare``'s tables), the number of points, and the curve itself, reduced to at most
  ``MAX_POINTS`` points by min/max buckets so a one-step spike (a grad-norm explosion, a k3 KL
  burst) survives. Its scalars also go to the trial's MLflow run as ``summary.*`` tags
  (``TrialSummary.tags``), so a compare without the workdir builds its tables from
  ``search_runs``.

A trial recorded before summaries existed, or whose summary no longer matches its file, is
summarised on the fly by the reader (one pass over the file, nothing written: readers are
read-only).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.store._files import TrialPaths, atomic_write_json
from orchestrator.store.records import MetricsCheck, TrialRecord, check_metrics, scan_metrics

SUMMARY_VERSION = 1
# The metrics compare draws and tabulates (final/peak reward, max k3 KL, max grad norm).
# fp16/skipped_share: an fp16 learner's share of skipped updates (compare: its mean per trial)
# eval/reward_ref: the reference evaluator's score (``eval: {reference: ...}``) and
# timing_s/eval_ref its time (compare: its sum per trial, the cost table's reference column)
CURVE_METRICS = (M.EVAL_REWARD, M.TRAIN_REWARD, M.K3_KL, M.GRAD_NORM, M.SKIPPED_SHARE,
                 M.EVAL_REWARD_REF, M.TIME_EVAL_REF)
MAX_POINTS = 512  # per reduced curve: about a plot's width in pixels
TAG_PREFIX = "summary."

Curve = list[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class Stamp:
    """``metrics.jsonl`` as one full check saw it: its size and mtime, and what the check found."""

    size: int
    mtime_ns: int
    good_through: int
    bad_lines: int = 0
    torn_tail: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Stamp | None:
        """The stamp in ``data``, or None when it is missing or malformed (then the file is
        checked in full: a stamp is a shortcut, never a source of truth)."""
        try:
            return cls(int(data["size"]), int(data["mtime_ns"]), int(data["good_through"]),
                       int(data.get("bad_lines", 0)), bool(data.get("torn_tail", False)))
        except (TypeError, KeyError, ValueError):
            return None

    def matches(self, path: Path) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns

    def check(self, path: Path, expected: int) -> MetricsCheck:
        return MetricsCheck(Path(path), self.good_through, self.bad_lines, self.torn_tail, expected)


def stamped_check(paths: TrialPaths, record: TrialRecord) -> MetricsCheck:
    """``records.check_metrics`` of a trial, from its stamp while the file is unchanged."""
    stamp = Stamp.from_json(record.metrics_stamp) if record.metrics_stamp else None
    if stamp is not None and stamp.matches(paths.metrics):
        return stamp.check(paths.metrics, record.last_step)
    return check_metrics(paths.metrics, record.last_step)


def reduce_curve(points: Sequence[tuple[int, float]], max_points: int = MAX_POINTS) -> Curve:
    """At most about ``max_points`` points: the first and last, and per bucket of steps its
    lowest and highest finite value (in step order) and its first non-finite one, so spikes and
    a NaN survive the reduction where even sampling would drop them."""
    pts = list(points)
    if len(pts) <= max_points:
        return pts
    size = math.ceil(len(pts) / max(max_points // 2 - 1, 1))
    keep = {0, len(pts) - 1}
    for lo in range(0, len(pts), size):
        idx = range(lo, min(lo + size, len(pts)))
        finite = [i for i in idx if math.isfinite(pts[i][1])]
        if finite:
            keep.add(min(finite, key=lambda i: pts[i][1]))
            keep.add(max(finite, key=lambda i: pts[i][1]))
        odd = next((i for i in idx if not math.isfinite(pts[i][1])), None)
        if odd is not None:
            keep.add(odd)
    return [pts[i] for i in sorted(keep)]


def final_value(points: Sequence[tuple[int, float]]) -> float:
    return next((v for _, v in reversed(points) if math.isfinite(v)), math.nan)


def peak_value(points: Sequence[tuple[int, float]]) -> float:
    return max((v for _, v in points if math.isfinite(v)), default=math.nan)


@dataclasses.dataclass(frozen=True)
class TrialSummary:
    """What compare needs of one finished trial (see the module docstring)."""

    stamp: Stamp
    last_step: int
    final: dict[str, float]
    peak: dict[str, float]
    points: dict[str, int]  # points per curve before the reduction
    curves: dict[str, Curve]  # reduced to at most about MAX_POINTS points

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SUMMARY_VERSION, "stamp": self.stamp.to_json(),
                "last_step": self.last_step, "final": self.final, "peak": self.peak,
                "points": self.points,
                # Columns, not [step, value] pairs: a third of the objects to parse per point.
                "curves": {k: {"steps": [p[0] for p in pts], "values": [p[1] for p in pts]}
                           for k, pts in self.curves.items()}}

    @classmethod
    def from_json(cls, data: Any) -> TrialSummary | None:
        try:
            if int(data.get("schema_version", 0)) != SUMMARY_VERSION:
                return None
            stamp = Stamp.from_json(data["stamp"])
            if stamp is None:
                return None
            return cls(stamp, int(data["last_step"]),
                       {str(k): float(v) for k, v in data["final"].items()},
                       {str(k): float(v) for k, v in data["peak"].items()},
                       {str(k): int(v) for k, v in data["points"].items()},
                       {str(k): _curve(pts) for k, pts in data["curves"].items()})
        except (TypeError, KeyError, ValueError, AttributeError):
            return None

    def tags(self) -> dict[str, str]:
        """The scalars as MLflow tags of the trial's run (exact: ``repr`` of each float)."""
        out = {f"{TAG_PREFIX}last_step": str(self.last_step),
               f"{TAG_PREFIX}version": str(SUMMARY_VERSION)}
        for key in self.points:
            out[f"{TAG_PREFIX}final.{key}"] = repr(self.final[key])
            out[f"{TAG_PREFIX}peak.{key}"] = repr(self.peak[key])
            out[f"{TAG_PREFIX}points.{key}"] = str(self.points[key])
        return out


def _curve(data: Any) -> Curve:
    """A curve from ``summary.json``: {"steps": [...], "values": [...]} (or [step, value] pairs,
    as the first summaries wrote it)."""
    if isinstance(data, dict):
        steps, values = data["steps"], data["values"]
        if len(steps) != len(values) or not all(type(x) is int for x in steps):
            raise ValueError("curve columns of different lengths or non-integer steps")
        return list(zip(steps, map(float, values)))
    return [(int(s), float(v)) for s, v in data]


def from_tags(tags: Mapping[str, str]) -> tuple[dict[str, float], dict[str, float], dict[str, int]] | None:
    """(final, peak, points) from a run's ``summary.*`` tags, or None when it has none. Tag keys
    pass MLflow's key sanitising unchanged for ``CURVE_METRICS`` (letters, ``/`` and ``_``)."""
    if tags.get(f"{TAG_PREFIX}version") != str(SUMMARY_VERSION):
        return None
    final, peak, points = {}, {}, {}
    try:
        for key in CURVE_METRICS:
            if f"{TAG_PREFIX}points.{key}" in tags:
                final[key] = float(tags[f"{TAG_PREFIX}final.{key}"])
                peak[key] = float(tags[f"{TAG_PREFIX}peak.{key}"])
                points[key] = int(tags[f"{TAG_PREFIX}points.{key}"])
    except (KeyError, ValueError):
        return None
    return final, peak, points


def summarize(path: Path, expected: int) -> tuple[TrialSummary, MetricsCheck, dict[str, Curve]]:
    """One pass over a metrics file: its summary, its check and its full curves."""
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    except OSError:
        size, mtime = -1, -1  # no file: a stamp that never matches
    check, curves = scan_metrics(path, expected, CURVE_METRICS)
    stamp = Stamp(size, mtime, check.good_through, check.bad_lines, check.torn_tail)
    last = max((pts[-1][0] for pts in curves.values() if pts), default=check.good_through)
    summary = TrialSummary(stamp, last, {k: final_value(v) for k, v in curves.items()},
                           {k: peak_value(v) for k, v in curves.items()},
                           {k: len(v) for k, v in curves.items()},
                           {k: reduce_curve(v) for k, v in curves.items()})
    return summary, check, curves


def write_summary(paths: TrialPaths, expected: int) -> TrialSummary:
    """Summarise a trial whose metrics file is final (the runner, at the trial's end)."""
    summary, _, _ = summarize(paths.metrics, expected)
    atomic_write_json(paths.summary, summary.to_json())
    return summary


def read_summary(paths: TrialPaths) -> TrialSummary | None:
    """The trial's summary if it still describes its metrics file, else None."""
    try:
        with open(paths.summary, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None  # absent or unreadable: the reader summarises the file itself
    summary = TrialSummary.from_json(data)
    return summary if summary is not None and summary.stamp.matches(paths.metrics) else None


def trial_metrics(paths: TrialPaths, record: TrialRecord) -> tuple[TrialSummary, MetricsCheck, bool]:
    """A finished trial's summary and the check of its metrics file: from ``summary.json`` when
    it matches the file, else from one pass over it (True then: the curves are full)."""
    summary = read_summary(paths)
    if summary is not None:
        return summary, summary.stamp.check(paths.metrics, record.last_step), False
    summary, check, curves = summarize(paths.metrics, record.last_step)
    return dataclasses.replace(summary, curves=curves), check, True
