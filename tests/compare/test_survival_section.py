"""How compare turns trials into survival data, and survival.csv / the summary section."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from orchestrator.compare import _survival as S
from orchestrator.compare import markdown as md
from orchestrator.compare._data import TrialResult
from orchestrator.stats.survival import Observation


def _trial(tid: str, verdict: str | None, step: int | None, last: int, reason: str = "") -> TrialResult:
    return TrialResult(trial_id=tid, run_id="r" + tid, axes={"c": "x"}, seed=0, pool="p", status="FINISHED",
                       verdict=verdict, verdict_step=step, verdict_reason=reason, derived_from=None,
                       curves={"eval/reward": [(last, 0.5)]}, latest={}, segments=[])


def test_events_censorings_and_left_out() -> None:
    # Stopped early 5 steps after the onset at 40: an event at 40, not a censoring at 45.
    stopped = _trial("a", "collapsed", 40, 45, "collapsed at step 40: ...; stopped early at step 45")
    assert S.observation(stopped) == Observation(40.0, True)
    assert S.observation(_trial("b", "healthy", None, 100)) == Observation(100.0, False)
    assert S.observation(_trial("c", "unstable", 30, 100)) == Observation(100.0, False)
    assert S.observation(_trial("d", "infra_failure", 12, 12)) is None
    warned = _trial("e", "healthy", None, 60, "healthy up to step 60 (stopped: early stop: mismatch early warning at step 50 (+10 margin))")
    assert S.observation(warned) == Observation(60.0, False)
    row = S.cell_survival([stopped, _trial("b", "healthy", None, 100), _trial("d", "infra_failure", 12, 12), warned], 100)
    assert (row["n"], row["events"], row["censored"], row["left_out"], row["censored_on_warning"]) == (3, 1, 2, 1, 1)
    # KM: 3 at risk at 40, one event -> 2/3 after; never below 0.5: the median is not reached.
    assert math.isinf(row["km_median_step"])
    assert row["rmst"] == 40 + 60 * 2 / 3


def test_survival_csv_and_summary_section(tmp_path: Path) -> None:
    trials = [_trial(f"n{i}", "collapsed", s, s + 5) for i, s in enumerate([30, 50, 70])]
    trials += [_trial(f"h{i}", "healthy", None, 100) for i in range(3)]
    for t in trials[3:]:
        t.axes = {"c": "y"}
    cells = [{"row": ("x",), "col": "", "trials": ["n0", "n1", "n2"]},
             {"row": ("y",), "col": "", "trials": ["h0", "h1", "h2"]}]
    sec = S.survival_section(trials, cells, ["c"], None, 100, tmp_path)
    rows = list(csv.DictReader((tmp_path / "survival.csv").open()))
    assert [r["cell"] for r in rows] == ["c=x", "c=y"]
    assert {"n", "events", "censored", "km_median_step", "rmst", "rmst_lo", "rmst_hi"} <= set(rows[0])
    assert rows[0]["km_median_step"] == "50.0" and float(rows[0]["rmst"]) == 50.0
    assert rows[1]["events"] == "0" and float(rows[1]["rmst"]) == 100.0
    assert sec["plot"] is not None and sec["plot"].stat().st_size > 1000
    text = "\n".join(S.markdown(sec, md.text))
    assert "## Time to collapse" in text and "| c=y | 3 | 0 | 3 | 0 | not reached" in text
