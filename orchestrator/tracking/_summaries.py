"""The grid's summary table (``store.summary_table``) as an artifact of a parent run.

Published when a submission ends, when ``ablate publish`` wrote runs, at the end of a local
``parent_run`` and by every ``ablate compare`` with the workdir; read by a compare without the
workdir (another machine, a tracking server), which then needs no metric history for the trials
the table agrees with. Publishing never fails its caller (the trial files and the runs hold the
same numbers); a table that does not read back is ignored with one warning.
"""
from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.store.summary import TrialSummary
from orchestrator.store.summary_table import (
    ARTIFACT_DIR,
    ARTIFACT_NAME,
    SHA_TAG,
    TRIALS_TAG,
    LocalMetrics,
    decode,
    encode,
)
from orchestrator.store.workspace import scoped_environ
from orchestrator.tracking._store import ROLE_TAG, fail_fast

log = logging.getLogger(__name__)
STAMPS_TAG = "summaries.stamps"


def fingerprint(summaries: Mapping[str, TrialSummary]) -> str:
    """A digest of which metrics files the table was made from: each trial's id and stamp
    (size, mtime, steps), which change whenever the file does."""
    h = hashlib.sha256()
    for tid in sorted(summaries):
        st = summaries[tid].stamp
        h.update(f"{tid}\0{st.size}\0{st.mtime_ns}\0{st.good_through}\n".encode())
    return h.hexdigest()


def publish_summaries(mlc: Any, run_id: str, grid: str,
                      source: Path | Mapping[str, TrialSummary] | None,
                      tags: Mapping[str, str] | None = None) -> int:
    """Log the table of ``source`` (a grid directory, or summaries already read from it) to
    run ``run_id``; returns the trials it holds (0: nothing logged). ``tags``: the run's, when
    the caller has them: a run whose table was made from the same metrics files (the same
    trials and stamps, ``STAMPS_TAG``) keeps it and nothing is sent."""
    try:
        summaries = (LocalMetrics.read(source).summaries if isinstance(source, Path | None)
                     else source)
        if not summaries:
            return 0
        stamps = fingerprint(summaries)
        if tags is not None and tags.get(STAMPS_TAG) == stamps and tags.get(SHA_TAG):
            return len(summaries)
        data = encode(grid, summaries)
        with tempfile.TemporaryDirectory(prefix="ablate-summaries-") as tmp, \
                fail_fast(mlc.tracking_uri, timeout_s=120):
            path = Path(tmp) / ARTIFACT_NAME
            path.write_bytes(data)
            mlc.log_artifact(run_id, str(path), ARTIFACT_DIR)
            # The tags after the file: a reader that sees them finds the file they describe.
            mlc.set_tag(run_id, SHA_TAG, hashlib.sha256(data).hexdigest())
            mlc.set_tag(run_id, TRIALS_TAG, str(len(summaries)))
            mlc.set_tag(run_id, STAMPS_TAG, stamps)
        return len(summaries)
    except Exception as exc:  # noqa: BLE001 - a shortcut for later readers, never the record
        log.warning("could not log the grid's summary table to run %s: %s", run_id, exc)
        return 0


def published_summaries(mlc: Any, experiment_id: str, grid: str) -> tuple[dict[str, TrialSummary], str]:
    """The newest summary table among the grid's parent runs: (trial id -> summary, "") or,
    when there is none, ({}, ""), or when it does not read back whole, ({}, why)."""
    runs = mlc.search_runs([experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'grid' and "
                           f"tags.`{SHA_TAG}` != ''", order_by=["attributes.start_time DESC"],
                           max_results=1)
    if not runs:
        return {}, ""
    run = runs[0]
    where = f"the grid's summary table ({ARTIFACT_DIR}/{ARTIFACT_NAME} of run {run.info.run_id})"
    try:
        with tempfile.TemporaryDirectory(prefix="ablate-summaries-") as tmp, \
                scoped_environ({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}):  # no bar on stderr
            path = Path(mlc.download_artifacts(run.info.run_id, f"{ARTIFACT_DIR}/{ARTIFACT_NAME}", tmp))
            data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != run.data.tags.get(SHA_TAG):
            raise ValueError("its bytes are not those its run's tag records (cut or replaced)")
        return decode(data, grid), ""
    except Exception as exc:  # noqa: BLE001 - any failure: the curves come from MLflow as before
        why = str(exc) if isinstance(exc, ValueError) else f"unreadable: {type(exc).__name__}"
        return {}, f"{where} is ignored: {why}; the curves are read from MLflow instead"
