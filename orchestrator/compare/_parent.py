"""What ``ablate compare`` leaves on the grid's newest parent run: the results directory (as
``results/``), the comparison as the run's description, and the grid's summary table
(``tracking.publish_summaries``), so the next compare on another machine reads one file.

The run's ``RESULTS_TAG`` is the digest of the results it holds (``_runs.results_digest``): a
compare whose results are those is done there and writes nothing (so the store stays as it was,
and the next compare may keep its run list, ``_runs``)."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.store.summary import TrialSummary
from orchestrator.tracking import ROLE_TAG, publish_summaries

log = logging.getLogger(__name__)
RESULTS_TAG = "ablate.results.sha256"


def log_to_parent(mlc: Any, experiment_id: str, out: Path, grid: str,
                  summaries: Mapping[str, TrialSummary], digest: str) -> str:
    """Log the results directory (``digest``: of its files) and the table of ``summaries`` (the
    workdir's) to the newest parent (grid) run, unless it holds them already; returns the digest
    the run holds now ("" when nothing could be logged). Never fails the command."""
    try:
        runs = mlc.search_runs([experiment_id], filter_string=f"tags.`{ROLE_TAG}` = 'grid'",
                               order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            log.warning("no grid run in experiment %s: results not logged to MLflow", experiment_id)
            return ""
        run = runs[0]
        if run.data.tags.get(RESULTS_TAG) == digest:  # the table is sent only if it changed
            publish_summaries(mlc, run.info.run_id, grid, summaries, tags=run.data.tags)
            return digest
        mlc.log_artifacts(run.info.run_id, str(out), "results")
        # The run's description in the MLflow UI: the comparison at a glance next to the runs.
        note = (out / "summary.md").read_text()
        cut = note.find("\n## Trials")
        note = note[:cut] if cut > 0 else note
        if len(note) > 7000:  # whole lines only: a cut never splits an escape or an entity
            note = note[:7000].rsplit("\n", 1)[0]
        mlc.set_tag(run.info.run_id, "mlflow.note.content", note)
        publish_summaries(mlc, run.info.run_id, grid, summaries, tags=run.data.tags)
        mlc.set_tag(run.info.run_id, RESULTS_TAG, digest)  # last: a run that has it holds the rest
        return digest
    except Exception as exc:  # noqa: BLE001 - the files on disk are the product; MLflow is a copy
        log.warning("could not log results to MLflow: %s", exc)
        return ""
