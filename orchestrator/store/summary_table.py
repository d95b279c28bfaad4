"""The grid's summary table: every finished trial's summary (``store.summary``) in one columnar
file, so a compare on another machine downloads one object instead of paging a thousand
trials' metric histories (issue 58).

A NumPy ``.npz`` archive (no pickles: read with ``allow_pickle=False``) of four arrays:

- ``meta``: UTF-8 JSON bytes: the format and its version, the grid's name, the trial-id scheme
  (``trial.ID_SCHEME``), the curve metrics in column order, and per trial its id, last step,
  final and peak values, points per curve and the stamp of its metrics file;
- ``steps`` (int64) and ``values`` (float64): every reduced curve, trial after trial, metric
  after metric (``CURVE_METRICS`` order);
- ``offsets`` (int64): where curve ``t * len(metrics) + m`` starts; one more entry at the end.

The table is a shortcut, never a source of truth. A reader takes a trial's entry only while it
agrees with the ``summary.*`` tags of the trial's MLflow run (``agrees``: the same last step,
final and peak values and point counts, which the runner wrote from the same summary), so an
entry of a trial resumed since, or of another grid or id scheme under the same trial id, is
never used; a table that does not read back whole, or describes another grid or id scheme, is
refused as a whole (``decode`` raises ``ValueError`` with the reason).

``LocalMetrics`` reads what a workdir says of a grid's trials (their states, the summaries of
the finished ones whose metrics file checks out): compare's source, and the table's.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.exceptions import StateFileError
from orchestrator.store import records
from orchestrator.store._files import TrialPaths
from orchestrator.store.summary import (
    CURVE_METRICS,
    TAG_PREFIX,
    Stamp,
    TrialSummary,
    from_tags,
    reduce_curve,
    trial_metrics,
)
from orchestrator.trial import ID_SCHEME, TrialState

FORMAT = "ablate-summaries"
VERSION = 1
ARTIFACT_DIR = "summaries"
ARTIFACT_NAME = "summaries.npz"
# Tags of the run the table is an artifact of: its SHA-256 (a download that is not it, cut or
# replaced, is refused) and how many trials it holds.
SHA_TAG = "summaries.sha256"
TRIALS_TAG = "summaries.trials"


@dataclasses.dataclass
class LocalMetrics:
    """What the workdir says about a grid's trials: their states, the summaries of the finished
    ones whose metrics file checks out, and what is wrong with the others' files."""

    states: dict[str, TrialState] = dataclasses.field(default_factory=dict)
    summaries: dict[str, TrialSummary] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    # Trials whose spec or state cannot be read as their own (corrupt, or another trial's),
    # with the one-line error and its fix: left out of every cell.
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, grid_dir: Path | None) -> LocalMetrics:
        out = cls()
        if grid_dir is None or not (Path(grid_dir) / "trials").is_dir():
            return out
        for tid in records.trial_ids(grid_dir):
            paths = TrialPaths(grid_dir, tid)
            try:
                records.load_spec(paths)
                rec = records.load_state(paths, tid)
            except StateFileError as exc:
                out.unreadable[tid] = str(exc)
                continue
            out.states[tid] = rec.state
            if not rec.state.is_finished():
                continue  # may be mid-rewind; compare leaves it out anyway
            summary, check, _ = trial_metrics(paths, rec)
            if check.ok:
                out.summaries[tid] = summary
            else:  # MLflow's copy is read instead; the file itself is what `ablate submit` repairs
                out.problems.append(f"trial {tid}: {check.describe()}")
        return out


def encode(grid: str, summaries: Mapping[str, TrialSummary]) -> bytes:
    """The table of ``summaries`` (trial id -> summary; curves reduced here if they are not)."""
    import numpy as np

    trials, steps, values, offsets = [], [], [], [0]
    for tid in sorted(summaries):
        s = summaries[tid]
        trials.append({"id": tid, "last_step": s.last_step, "final": s.final, "peak": s.peak,
                       "points": s.points, "stamp": s.stamp.to_json()})
        for key in CURVE_METRICS:
            pts = reduce_curve(s.curves.get(key, []))
            steps.extend(p[0] for p in pts)
            values.extend(p[1] for p in pts)
            offsets.append(len(steps))
    meta = {"format": FORMAT, "version": VERSION, "grid": grid, "id_scheme": ID_SCHEME,
            "metrics": list(CURVE_METRICS), "trials": trials}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                        steps=np.asarray(steps, dtype=np.int64),
                        values=np.asarray(values, dtype=np.float64),
                        offsets=np.asarray(offsets, dtype=np.int64))
    return buf.getvalue()


def decode(data: bytes, grid: str) -> dict[str, TrialSummary]:
    """Trial id -> summary from a table of grid ``grid``; ``ValueError`` saying why not."""
    import numpy as np

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes().decode())
            steps, values, offsets = npz["steps"], npz["values"], npz["offsets"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise ValueError(f"not a readable table ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} summary table")
    if meta.get("grid") != grid:
        raise ValueError(f"the table of grid {str(meta.get('grid'))[:80]!r}, not of {grid!r}")
    if meta.get("id_scheme") != ID_SCHEME:
        raise ValueError(f"trial ids of scheme {meta.get('id_scheme')!r}, not {ID_SCHEME}")
    metrics, trials = meta.get("metrics"), meta.get("trials")
    if not isinstance(metrics, list) or not isinstance(trials, list):
        raise ValueError("no metric or trial list")  # noqa: TRY004 - decode refuses with ValueError, whatever is wrong
    width = len(metrics)
    if (offsets.ndim != 1 or len(offsets) != len(trials) * width + 1 or offsets[0] != 0
            or offsets[-1] != len(steps) or len(steps) != len(values)
            or bool(np.any(np.diff(offsets) < 0))):
        raise ValueError("its curve columns do not line up with its trials")
    step_list, value_list, cuts = steps.tolist(), values.tolist(), offsets.tolist()
    out: dict[str, TrialSummary] = {}
    try:
        for t, entry in enumerate(trials):
            stamp = Stamp.from_json(entry["stamp"])
            if stamp is None:
                raise ValueError("a trial without its stamp")
            curves = {}
            for m, key in enumerate(metrics):
                lo, hi = cuts[t * width + m], cuts[t * width + m + 1]
                if hi > lo:
                    curves[str(key)] = list(zip(step_list[lo:hi], value_list[lo:hi]))
            out[str(entry["id"])] = TrialSummary(
                stamp, int(entry["last_step"]), {str(k): float(v) for k, v in entry["final"].items()},
                {str(k): float(v) for k, v in entry["peak"].items()},
                {str(k): int(v) for k, v in entry["points"].items()}, curves)
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"a damaged trial entry ({type(exc).__name__})") from None
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def agrees(entry: TrialSummary, tags: Mapping[str, Any]) -> bool:
    """Whether a table entry is the summary the run's ``summary.*`` tags were written from."""
    tagged = from_tags(tags)
    last = str(tags.get(f"{TAG_PREFIX}last_step", ""))
    if tagged is None or not last.isdigit() or int(last) != entry.last_step:
        return False
    final, peak, points = tagged
    return (points == entry.points and final.keys() == entry.final.keys()
            and peak.keys() == entry.peak.keys()
            and all(_same(final[k], entry.final[k]) and _same(peak[k], entry.peak[k]) for k in final))
