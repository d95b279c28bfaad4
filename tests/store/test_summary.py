"""A trial's summary and metrics stamp (``store.summary``): what readers trust instead of
parsing every metrics file, and when they stop trusting it."""
from __future__ import annotations

import math
import os
from pathlib import Path

from orchestrator import metrics as M
from orchestrator.store import TrialPaths, records, summary


def _trial(tmp_path: Path, steps: int) -> tuple[TrialPaths, records.TrialRecord]:
    paths = TrialPaths(tmp_path, "t000000000001")
    paths.root.mkdir(parents=True)
    records.write_metrics(paths.metrics, [(s, {M.TRAIN_REWARD: s / steps, M.GRAD_NORM: 1.0,
                                               "other/x": 2.0}) for s in range(1, steps + 1)])
    return paths, records.TrialRecord(trial_id="t000000000001", last_step=steps)


def test_reduce_keeps_the_ends_the_spikes_and_a_nan() -> None:
    pts = [(s, 1.0 + 0.001 * s) for s in range(1, 5001)]
    pts[1233] = (1234, 400.0)  # a one-step grad-norm explosion
    pts[2999] = (3000, -50.0)
    pts[3999] = (4000, math.nan)
    out = summary.reduce_curve(pts, 512)
    assert len(out) <= 512 + 256  # two per bucket, plus the first non-finite and the ends
    assert out[0] == pts[0] and out[-1] == pts[-1]
    assert (1234, 400.0) in out and (3000, -50.0) in out
    assert any(s == 4000 and math.isnan(v) for s, v in out)
    assert [s for s, _ in out] == sorted({s for s, _ in out})
    assert summary.reduce_curve(pts[:100], 512) == pts[:100]  # short curves stay whole


def test_status_trusts_the_stamp_only_while_the_file_is_unchanged(tmp_path: Path) -> None:
    paths, rec = _trial(tmp_path, 30)
    s = summary.write_summary(paths, 30)
    rec.metrics_stamp = s.stamp.to_json()
    assert summary.stamped_check(paths, rec).ok
    # Same size and mtime, different bytes: the stamp is trusted (nothing is parsed) ...
    st = paths.metrics.stat()
    data = paths.metrics.read_bytes()
    paths.metrics.write_bytes(data[:100] + b"#" + data[101:])
    os.utime(paths.metrics, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert summary.stamped_check(paths, rec).ok
    assert not records.check_metrics(paths.metrics, 30).ok
    # ... a changed mtime (any write) sends the reader back to the file.
    os.utime(paths.metrics, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert summary.stamped_check(paths, rec).bad_lines == 1
    rec.metrics_stamp = {"size": "garbage"}  # a malformed stamp is no stamp
    assert summary.stamped_check(paths, rec).bad_lines == 1


def test_trial_metrics_reads_the_summary_or_summarises_on_the_fly(tmp_path: Path) -> None:
    paths, rec = _trial(tmp_path, 700)
    # A trial from before summaries: one pass over the file, full curves, nothing written.
    s, check, full = summary.trial_metrics(paths, rec)
    assert full and check.ok and not paths.summary.exists()
    assert len(s.curves[M.TRAIN_REWARD]) == 700 and s.points[M.TRAIN_REWARD] == 700
    assert s.final[M.TRAIN_REWARD] == 1.0 and s.peak[M.GRAD_NORM] == 1.0 and s.last_step == 700
    assert "other/x" not in s.curves
    written = summary.write_summary(paths, 700)
    s2, check2, full2 = summary.trial_metrics(paths, rec)
    assert not full2 and check2.ok and s2 == written
    assert len(s2.curves[M.TRAIN_REWARD]) <= summary.MAX_POINTS  # reduced on disk
    assert (s2.final, s2.peak, s2.points) == (s.final, s.peak, s.points)  # exact all the same
    with paths.metrics.open("a") as fh:  # the file moved on: the summary is stale
        fh.write(records.metric_line(701, {M.TRAIN_REWARD: 5.0}))
    s3, _, full3 = summary.trial_metrics(paths, rec)
    assert full3 and s3.final[M.TRAIN_REWARD] == 5.0
    paths.summary.write_text("{not json")  # a corrupt summary is a cache miss, not an error
    assert summary.read_summary(paths) is None


def test_summary_tags_round_trip() -> None:
    s = summary.TrialSummary(summary.Stamp(1, 2, 3), 3, {M.K3_KL: 0.1 + 0.2, M.EVAL_REWARD: math.nan},
                             {M.K3_KL: 7.5, M.EVAL_REWARD: math.nan}, {M.K3_KL: 3, M.EVAL_REWARD: 0}, {})
    final, peak, points = summary.from_tags(s.tags())
    assert final[M.K3_KL] == 0.1 + 0.2 and math.isnan(final[M.EVAL_REWARD]) and points == s.points
    assert peak[M.K3_KL] == 7.5
    assert summary.from_tags({}) is None
