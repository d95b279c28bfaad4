"""A trial's ``metrics.jsonl`` checked against its ``state.json`` before anything relies on it,
and repaired: by ``ablate submit`` (every trial of the grid) and ``ablate resume`` (the trials it
resumes). ``ablate status`` and ``ablate compare`` only report (``records.check_metrics``).

``metrics.jsonl`` is the source of truth, so a file that lost its end (a disk that filled, a
copy cut short, an editor) must never pass for a shorter run: a finished trial would show
``done 15/30`` and a resume would refill MLflow from the hole. Three repairs, in this order:

* a torn line (the writer killed mid-line) is dropped;
* missing steps that the trial's MLflow run holds (MLflow holds every step up to
  ``committed_step``) are written back from its metric history, value for value;
* otherwise the trial resumes from its newest verified checkpoint at or before the last step
  the file still holds (a ``ResumeRequest``; from scratch without one), so the steps after it
  are computed again and its MLflow run is replaced by a refilled one (``run._commits``).

Every repair is said (one line per trial, on stderr, and in the submission's summary).
"""
from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.store import CheckpointStore, ResumeRequest, TrialPaths, records
from orchestrator.tracking import client, fail_fast, sanitize_key
from orchestrator.trial import Attempt, TrialState, transition

if TYPE_CHECKING:
    from orchestrator.schema import CheckpointSpec

log = logging.getLogger(__name__)


def repair_trial(paths: TrialPaths, rec: records.TrialRecord, *, tracking_uri: str,
                 checkpoint: CheckpointSpec) -> list[str]:
    """``ablate submit``'s repairs of one trial that is not running (its lost attempts list,
    its metrics file), each said on stderr; returns what was done."""
    notes = [n for n in (restore_attempts(paths, rec, tracking_uri=tracking_uri),
                         repair_metrics(paths, rec, tracking_uri=tracking_uri, checkpoint=checkpoint))
             if n is not None]
    for note in notes:
        print(f"repaired: {note}", file=sys.stderr, flush=True)
    return notes


def repair_metrics(paths: TrialPaths, rec: records.TrialRecord, *, tracking_uri: str,
                   checkpoint: CheckpointSpec, reopen: bool = True) -> str | None:
    """Check the trial's metrics file against ``rec`` (not running: the caller holds its run
    lock) and repair it; returns what was done, or None when the file was sound. With
    ``reopen`` False a file that MLflow cannot complete is left for the caller to refuse."""
    check = records.check_metrics(paths.metrics, rec.last_step)
    if check.ok:
        return None
    done = []
    if check.torn:
        records.repair_torn(paths.metrics)
        done.append("dropped the torn line")
    if check.missing:
        restored = _from_mlflow(paths, rec, check.good_through, tracking_uri)
        if restored is not None:
            done.append(f"restored steps {check.good_through + 1}-{rec.last_step} from MLflow run "
                        f"{rec.mlflow_run_id}")
        elif reopen:
            done.append(_resume_from_checkpoint(paths, rec, check.good_through, checkpoint))
        else:
            done.append("MLflow does not hold the missing steps")
    return f"trial {rec.trial_id}: {check.describe()}; " + ", ".join(done)


def restore_attempts(paths: TrialPaths, rec: records.TrialRecord, *, tracking_uri: str) -> str | None:
    """A trial that had attempts but lost its ``attempts.json`` (deleted as the corrupt-file
    message says) gets it back from its MLflow run's ``attempts.json`` artifact, if the run has
    one; returns what was done, or None."""
    if paths.attempts.exists() or rec.attempts == 0 or rec.mlflow_run_id is None:
        return None
    try:
        with fail_fast(tracking_uri), tempfile.TemporaryDirectory() as tmp:
            local = client(tracking_uri).download_artifacts(rec.mlflow_run_id, "attempts.json", tmp)
            data = json.loads(Path(local).read_text())
            attempts = [Attempt.from_json(a) for a in data["attempts"]]
    except Exception as exc:  # noqa: BLE001 - no artifact, or the store is down: nothing to restore
        log.info("trial %s: attempts.json not restored: %s", rec.trial_id, exc)
        return None
    records.save_attempts(paths, attempts)
    return (f"trial {rec.trial_id}: {paths.attempts} was missing; restored its {len(attempts)} "
            f"attempt(s) from MLflow run {rec.mlflow_run_id}")


def _from_mlflow(paths: TrialPaths, rec: records.TrialRecord, have: int,
                 tracking_uri: str) -> list[tuple[int, dict[str, float]]] | None:
    """Rewrite the metrics file as steps 1..``have`` from the file and the rest from the trial's
    MLflow run, if that run holds every missing step; the rows written, or None."""
    if rec.mlflow_run_id is None or rec.committed_step < rec.last_step:
        return None
    kept = [(s, m) for s, m in records.iter_metrics(paths.metrics) if s <= have]
    names = {sanitize_key(k): k for _s, m in kept for k in m}  # MLflow's names back to ours
    try:
        with fail_fast(tracking_uri):
            mlc = client(tracking_uri)
            run = mlc.get_run(rec.mlflow_run_id)
            rows: dict[int, dict[str, float]] = {}
            for key in run.data.metrics:
                newest: dict[int, Any] = {}
                for m in mlc.get_metric_history(rec.mlflow_run_id, key):
                    if have < m.step <= rec.last_step and (
                            m.step not in newest or m.timestamp >= newest[m.step].timestamp):
                        newest[m.step] = m
                for step, m in newest.items():
                    rows.setdefault(step, {})[names.get(key, key)] = float(m.value)
    except Exception as exc:  # noqa: BLE001 - an unreachable store means: resume instead
        log.info("trial %s: MLflow history not read: %s", rec.trial_id, exc)
        return None
    if sorted(rows) != list(range(have + 1, rec.last_step + 1)):
        return None
    out = kept + sorted(rows.items())
    records.write_metrics(paths.metrics, out)
    return out


def _resume_from_checkpoint(paths: TrialPaths, rec: records.TrialRecord, have: int,
                            checkpoint: CheckpointSpec) -> str:
    """Ask the trial's next attempt to start from the newest verified checkpoint the file still
    covers (from scratch without one); reopens a finished trial."""
    store = CheckpointStore.for_trial(checkpoint.store, paths.root, rec.trial_id, checkpoint.keep)
    start = store.latest(before=have + 1)
    rec.resume = ResumeRequest(rec.resume.pool if rec.resume else None,
                               start if start is not None else "fresh",
                               f"metrics.jsonl short: steps {have + 1}-{rec.last_step} missing")
    if rec.state.is_finished():
        rec.state = transition(rec.state, TrialState.PENDING, resume=True)
        rec.verdict = rec.error = None
    records.save_state(paths, rec)
    return (f"resuming it from its checkpoint of step {start}" if start is not None
            else "no checkpoint covers the file: running it again from step 1")


def missing_before(paths: TrialPaths, rec: records.TrialRecord, start: int) -> str | None:
    """A one-line problem when the metrics file lacks a step up to ``start`` (where a resume
    begins, keeping the file's rows up to it), else None."""
    check = records.check_metrics(paths.metrics, rec.last_step)
    if check.good_through >= min(start, rec.last_step):
        return None
    return check.describe()
