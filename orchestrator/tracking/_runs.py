"""The MLflow child run of one trial (``TrialRun``): batched per-step metrics, attempts, the
verdict, its end, and what becomes of it later (``supersede``, ``drain``).

A ``TrialRun`` never raises for a tracking outage: rows go to an on-disk outbox
(``_outbox.Outbox``) first and are sent in ``log_batch`` calls of up to 1000 values; if the store
is unreachable they stay there and go out on a later call (with exponential back-off between
attempts) or at ``flush``/``end``. ``drain(buffer_dir, tracking_uri)`` finishes the outbox of a
run whose process is gone. The grid's parent run is ``_grid_run``; the params and tags a run is
labelled with are ``_labels``.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.store import read_json
from orchestrator.tracking._labels import (
    CREATION_TAG,
    MAX_METRICS,
    MAX_PARAMS_TAGS,
    THROUGH_TAG,
    _chunks,
    _tags,
    attempt_tags,
    trial_params,
    trial_run_name,
    trial_tags,
)
from orchestrator.tracking._outbox import Outbox
from orchestrator.tracking._store import (
    client,
    fail_fast,
    is_permanent,
    sanitize_key,
)

if TYPE_CHECKING:

    from orchestrator.pools import PoolSpec
    from orchestrator.trial import Attempt, TrialSpec
    from orchestrator.verdict import Verdict

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 30.0


class TrialRun:
    """The nested MLflow run of one trial, fed through a durable on-disk outbox."""

    def __init__(self, tracking_uri: str, experiment_id: str, parent_run_id: str | None,
                 trial: TrialSpec, pool: PoolSpec, *, run_id: str | None, buffer_dir: Path) -> None:
        self.trial = trial
        self.pool = pool
        outbox = Outbox(Path(buffer_dir))
        if run_id is not None and outbox.run_id not in (None, run_id):
            raise ValueError(f"{buffer_dir} buffers run {outbox.run_id}, not {run_id}")
        outbox.run_id = run_id or outbox.run_id
        outbox.save_state()
        self._bind(tracking_uri, experiment_id, parent_run_id, outbox)
        self._connect()

    def _bind(self, tracking_uri: str, experiment_id: str, parent_run_id: str | None,
              outbox: Outbox, *, connected: bool = False, next_try: float = 0.0) -> None:
        """The store, the outbox and the sending state (the one place that lists them; ``drain``
        and ``_deferred.DeferredRun`` bind a run without creating one)."""
        self.tracking_uri, self.experiment_id, self.parent_run_id = tracking_uri, experiment_id, parent_run_id
        self.outbox = outbox
        self._connected, self._next_try, self._backoff = connected, next_try, 1.0
        self.last_error: str | None = None

    @property
    def run_id(self) -> str | None:
        """The child run's id (None only while the store has been unreachable since creation)."""
        return self.outbox.run_id

    # ----------------------------------------------------------------- connection

    def _connect(self) -> bool:
        """Create the run (or mark a reopened one RUNNING); False while the store is down."""
        def create() -> None:
            mlc = client(self.tracking_uri)
            if self.outbox.run_id is None:
                self.outbox.run_id = self._create(mlc)
                self.outbox.save_state()
            else:
                run = mlc.get_run(self.outbox.run_id)
                if self.outbox.through_step == 0 and not self.outbox.rows:
                    # A fresh buffer for an existing run (another machine): trust the store's mark.
                    self.outbox.through_step = int(run.data.tags.get(THROUGH_TAG, 0) or 0)
                    self.outbox.last_step = max(self.outbox.last_step, self.outbox.through_step)
                    self.outbox.save_state()
                if run.info.status != "RUNNING" and self.outbox.end_status is None:
                    mlc.update_run(self.outbox.run_id, status="RUNNING")
            if not self.outbox.params_logged:
                # Also after an outage between create_run and here (logging equal params is allowed).
                from mlflow.entities import Param

                items = [Param(k, v) for k, v in trial_params(self.trial).items()]
                for chunk in _chunks(items, MAX_PARAMS_TAGS):
                    mlc.log_batch(self.outbox.run_id, params=list(chunk))
                self.outbox.params_logged = True
                self.outbox.save_state()
            self._connected = True

        self._connected = False
        return self._attempt(create)

    def _create(self, mlc: Any) -> str:
        """The run's id: the run an earlier creation of this outbox left in the store (its
        process died, or lost the store's reply, before ``run.json`` named it), else a new run.
        So a trial never has two live runs: ``_orphans`` retires any other."""
        token = self.outbox.creation_token
        if token is None:
            self.outbox.creation_token = token = uuid.uuid4().hex
            self.outbox.save_state()  # before the store can hold a run that nothing names
        else:
            found = mlc.search_runs([self.experiment_id], max_results=1,
                                    filter_string=f"tags.`{CREATION_TAG}` = '{token}'")
            if found:
                log.info("trial %s: adopting MLflow run %s, created by a process that died "
                         "before recording it", self.trial.trial_id, found[0].info.run_id)
                return str(found[0].info.run_id)
        run = mlc.create_run(self.experiment_id, run_name=trial_run_name(self.trial),
                             start_time=self.outbox.started_ms,
                             tags={**trial_tags(self.trial, self.pool, self.parent_run_id),
                                   CREATION_TAG: token})
        return str(run.info.run_id)

    def _attempt(self, fn: Any) -> bool:
        """Run ``fn`` against the store; on an outage remember it and back off, never raise."""
        with fail_fast(self.tracking_uri):
            try:
                fn()
            except Exception as exc:
                if is_permanent(exc):
                    raise
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                if self._backoff <= 1.0:
                    log.warning("MLflow store %s unreachable, buffering in %s: %s",
                                self.tracking_uri, self.outbox.root, self.last_error)
                self._next_try = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
                return False
        self._backoff, self._next_try, self.last_error = 1.0, 0.0, None
        return True

    # ----------------------------------------------------------------- logging

    def log(self, rows: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Buffer per-step metrics durably, then send what is pending (if the store is up)."""
        clean = [(step, {sanitize_key(k): v for k, v in values.items()}) for step, values in rows]
        self.outbox.add_rows(clean)
        self._pump()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.outbox.add_tags({sanitize_key(k): str(v) for k, v in tags.items()})
        self._pump()

    def log_attempts(self, attempts: Sequence[Attempt]) -> None:
        """Tags per attempt (pool, step range, outcome) and an ``attempts.json`` artifact."""
        self.outbox.add_artifact("attempts.json", {"trial_id": self.trial.trial_id,
                                                   "attempts": [a.to_json() for a in attempts]})
        pool = getattr(self, "pool", None)  # a deferred run (``_deferred``) has none
        self.set_tags(attempt_tags(attempts, self.trial.steps, pool))

    def set_verdict(self, verdict: Verdict) -> None:
        self.outbox.add_artifact("verdict.json", verdict.to_json())
        self.set_tags(verdict.tags())

    def _pump(self) -> None:
        if time.monotonic() >= self._next_try:
            self._send()

    def _send(self) -> bool:
        """Send everything pending; True when the outbox is empty afterwards."""
        if not self._connected and not self._connect():
            return False
        return self._attempt(self._send_all) and self.outbox.empty()

    def _send_all(self) -> None:
        from mlflow.entities import Metric

        mlc = client(self.tracking_uri)
        run_id = self.outbox.run_id
        assert run_id is not None
        flat = [(row["step"], row["ts"], k, v) for row in self.outbox.rows for k, v in row["metrics"].items()]
        last_full = sent_through = self.outbox.through_step
        for start in range(0, len(flat), MAX_METRICS):
            chunk = flat[start:start + MAX_METRICS]
            end, step = start + len(chunk), chunk[-1][0]
            # A step split across two chunks is only complete once its last chunk is in.
            last_full = max(last_full, step if end >= len(flat) or flat[end][0] != step else step - 1)
            # Newest step first: MLflow's SQL store compares each value with the run's latest
            # one and rewrites that row whenever it is newer; in step order that is every value.
            metrics = [Metric(k, v, ts, s) for s, ts, k, v in reversed(chunk)]
            try:
                mlc.log_batch(run_id, metrics=metrics, tags=_tags({THROUGH_TAG: last_full}))
            except Exception:
                # The chunks before this one are in the store (with the THROUGH_TAG): drop them
                # so the retry after the outage does not re-send them.
                if sent_through > self.outbox.through_step:
                    self.outbox.mark_sent(sent_through)
                raise
            sent_through = last_full
        if flat:
            # A resend after a failure is idempotent because each row keeps its timestamp.
            self.outbox.mark_sent(last_full)
        tags = self.outbox.pending_tags()
        if tags:
            for chunk in _chunks(list(tags.items()), MAX_PARAMS_TAGS):
                mlc.log_batch(run_id, tags=_tags(dict(chunk)))
            self.outbox.drop_tags(tags)
        for path in self.outbox.pending_artifacts():
            mlc.log_artifact(run_id, str(path))
            self.outbox.artifact_sent(path)
        if self.outbox.end_status is not None:
            mlc.set_terminated(run_id, self.outbox.end_status, end_time=self.outbox.ended_ms)

    def flush(self, timeout: float = 30) -> bool:
        """Try to empty the outbox for up to ``timeout`` seconds; True if everything is in the store."""
        deadline = time.monotonic() + timeout
        while True:
            if self._send():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(max(self._next_try - time.monotonic(), 0.2), left, 5.0))

    def end(self, status: str = "FINISHED", timeout: float = 30) -> bool:
        """Mark the run FINISHED/FAILED/KILLED once everything is sent; the outbox keeps the
        status if the store is down, and ``drain`` (or the next ``TrialRun`` on this buffer)
        finishes it. Returns True when the run is closed in the store."""
        if status not in ("FINISHED", "FAILED", "KILLED"):
            raise ValueError(f"status {status!r} must be FINISHED, FAILED or KILLED")
        self.outbox.set_end(status)
        return self.flush(timeout)

    def env(self) -> dict[str, str]:
        """Environment for a verl job that should log into this run with its own MLflow logger."""
        if self.run_id is None:
            return {}
        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_RUN_ID": self.run_id}


def supersede(tracking_uri: str, old_run_id: str, new_run_id: str) -> bool:
    """Mark ``old_run_id`` as replaced by ``new_run_id`` and soft-delete it (MLflow keeps it,
    restorable from the UI's deleted runs). False if the store is unreachable (the caller keeps
    the old id in ``state.json`` and tries again on the next attempt)."""
    mlc = client(tracking_uri)
    with fail_fast(tracking_uri):
        try:
            run = mlc.get_run(old_run_id)
            if run.info.lifecycle_stage == "deleted":
                return True
            mlc.set_tag(old_run_id, "superseded_by", new_run_id)
            if run.info.status == "RUNNING":
                mlc.set_terminated(old_run_id, "KILLED")
            mlc.delete_run(old_run_id)
            return True
        except Exception as exc:  # noqa: BLE001 - retried on the trial's next attempt
            if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return True  # gone already (purged by `mlflow gc`)
            log.warning("could not mark MLflow run %s superseded by %s: %s", old_run_id, new_run_id, exc)
            return False


def outbox_run_id(buffer_dir: Path) -> str | None:
    """The run id an outbox names, or None (no outbox, or its run not created yet)."""
    path = Path(buffer_dir) / "run.json"
    return read_json(path).get("run_id") if path.exists() else None


def drain(buffer_dir: Path, tracking_uri: str, timeout: float = 30) -> bool:
    """Send the outbox of a run whose process is gone (pending metrics, tags, artifacts, end)."""
    outbox = Outbox(Path(buffer_dir))
    if outbox.run_id is None:
        return outbox.empty()
    run = TrialRun.__new__(TrialRun)  # no trial/pool needed: the run exists, only the outbox is sent
    run._bind(tracking_uri, "", None, outbox, connected=True)
    return run.flush(timeout)
