"""The MLflow runs of a grid: one experiment per grid, a parent run per submission
(``GridRun``), a nested child run per trial (``TrialRun``) with its axis values as params,
placement and versions as tags, batched per-step metrics, attempts, lineage and the verdict.

A ``TrialRun`` never raises for a tracking outage: rows go to an on-disk outbox
(``_outbox.Outbox``) first and are sent in ``log_batch`` calls of up to 1000 values; if the store
is unreachable they stay there and go out on a later call (with exponential back-off between
attempts) or at ``flush``/``end``. ``drain(buffer_dir, tracking_uri)`` finishes the outbox of a
run whose process is gone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cost import cost_tags, trial_cost
from orchestrator.exceptions import UserError
from orchestrator.metrics import param_key
from orchestrator.store import workspace
from orchestrator.store.records import effective_ranges
from orchestrator.tracking._orphans import close_orphaned_parents, process_tags
from orchestrator.tracking._outbox import Outbox
from orchestrator.tracking._store import (
    AXES_TAG,
    CONFIG_TAG,
    PARENT_TAG,
    ROLE_TAG,
    client,
    fail_fast,
    is_permanent,
    is_remote,
    sanitize_key,
    use_wal,
)
from orchestrator.tracking._views import save_trials_view

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from orchestrator.grid import GridSpec
    from orchestrator.pools import PoolSpec
    from orchestrator.trial import Attempt, TrialSpec
    from orchestrator.verdict import Verdict

log = logging.getLogger(__name__)

THROUGH_TAG = "ablate.logged_through_step"  # last step whose metrics are all in the store
MAX_METRICS = 999  # MLflow: 1000 entities per log_batch; one slot is the THROUGH_TAG
MAX_PARAMS_TAGS = 100
MAX_TAG_LEN = 5000
BACKOFF_MAX_S = 30.0
VERSION_PACKAGES = ("rl-ablate", "torch", "mlflow", "ray", "verl", "sglang", "vllm", "transformers")


@dataclasses.dataclass(frozen=True)
class TrackingTarget:
    """Where the trial's MLflow child run lives (the parent run is the grid submission)."""

    uri: str
    experiment_id: str  # "" while the orchestrator is still opening the parent run
    parent_run_id: str | None


@functools.lru_cache(maxsize=1)
def provenance_tags() -> dict[str, str]:
    """Package versions and the git commit of the orchestrator (never environment values)."""
    tags = {"version.python": ".".join(map(str, sys.version_info[:3]))}
    for pkg in VERSION_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            tags[f"version.{pkg}"] = importlib.metadata.version(pkg)
    repo = Path(__file__).resolve().parents[2]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
        if out.returncode == 0 and out.stdout.strip():
            tags["git.commit"] = tags["mlflow.source.git.commit"] = out.stdout.strip()
    return tags


def experiment_for(mlc: MlflowClient, name: str, tracking_uri: str, workdir: Path | None) -> str:
    """Id of the grid's experiment, created on first use (artifacts under the workdir locally)."""
    exp = mlc.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            mlc.restore_experiment(exp.experiment_id)
        return str(exp.experiment_id)
    location = None
    if not is_remote(tracking_uri):
        location = (workspace.artifact_root(workdir) / name).as_uri()
    from mlflow.exceptions import MlflowException

    try:
        return str(mlc.create_experiment(name, artifact_location=location, tags={ROLE_TAG: "grid"}))
    except MlflowException:  # created concurrently by another process
        exp = mlc.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _chunks(items: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _tags(mapping: Mapping[str, Any]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(str(k), str(v)[:MAX_TAG_LEN]) for k, v in mapping.items()]


class GridRun:
    """The grid's experiment and the parent run of one submission."""

    def __init__(self, tracking_uri: str, experiment_id: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.run_id = run_id

    @classmethod
    def open(cls, grid: GridSpec, *, tracking_uri: str, workdir: Path,
             run_id: str | None = None) -> GridRun:
        """Create (or reopen with ``run_id``) the parent run; an unreachable store is a user error."""
        mlc = client(tracking_uri)
        try:
            with fail_fast(tracking_uri, timeout_s=30):
                exp_id = experiment_for(mlc, grid.name, tracking_uri, workdir)
                use_wal(tracking_uri)  # the store file exists now
                if run_id is not None:
                    mlc.update_run(run_id, status="RUNNING")
                    return cls(tracking_uri, exp_id, run_id)
                tags = {ROLE_TAG: "grid", "grid": grid.name, "grid.file": str(grid.file),
                        "grid.recipe_digest": grid.recipe_digest, "backend": grid.backend,
                        "axes": ", ".join(a.name for a in grid.axes), **provenance_tags(),
                        **process_tags()}
                run = mlc.create_run(exp_id, run_name=f"{grid.name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
                                     tags=tags)
                from mlflow.entities import Param

                params = {"recipe": grid.spec.recipe, "backend": grid.backend, "steps": grid.spec.steps,
                          "seeds": ",".join(map(str, grid.spec.seed_values))}
                mlc.log_batch(run.info.run_id, params=[Param(k, str(v)) for k, v in params.items()])
                save_trials_view(mlc, exp_id, [a.name for a in grid.axes])
                close_orphaned_parents(mlc, exp_id, keep=run.info.run_id)
                return cls(tracking_uri, exp_id, run.info.run_id)
        except Exception as exc:
            if is_permanent(exc):
                raise
            raise UserError(f"MLflow tracking store {tracking_uri} is unreachable ({type(exc).__name__}); "
                            "fix: start the server or pass --tracking-uri") from None

    @property
    def target(self) -> TrackingTarget:
        """Where the submission's trial runs go: its experiment, under this parent run."""
        return TrackingTarget(self.tracking_uri, self.experiment_id, self.run_id)

    def log_artifacts(self, directory: Path, artifact_path: str | None = None) -> None:
        client(self.tracking_uri).log_artifacts(self.run_id, str(directory), artifact_path)

    def log_cost(self, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        """The grid's cost (``orchestrator.cost.total_metrics``) and budget on the parent run;
        never fails the submission (the trial files hold the same numbers)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            with fail_fast(self.tracking_uri):
                client(self.tracking_uri).log_batch(
                    self.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                    tags=_tags(tags))
        except Exception as exc:  # noqa: BLE001 - the cost is on disk too (ablate status)
            log.warning("could not log the grid's cost to run %s: %s", self.run_id, exc)

    def end(self, status: str = "FINISHED") -> None:
        with fail_fast(self.tracking_uri):
            try:
                client(self.tracking_uri).set_terminated(self.run_id, status)
            except Exception as exc:  # noqa: BLE001 - trial state is on disk; the parent status is cosmetic
                log.warning("could not end grid run %s: %s", self.run_id, exc)


@contextlib.contextmanager
def parent_run(grid: GridSpec, *, tracking_uri: str, workdir: Path) -> Iterator[TrackingTarget]:
    """A submission's parent run around work done in this process (``ablate run-trial``, a
    local resume): opened first, ended FINISHED, or FAILED if the work raised (re-raised)."""
    parent = GridRun.open(grid, tracking_uri=tracking_uri, workdir=workdir)
    try:
        yield parent.target
    except BaseException:
        parent.end("FAILED")
        raise
    parent.end("FINISHED")


def trial_run_name(trial: TrialSpec) -> str:
    label = "/".join(v for k, v in trial.axes if k != "pool")
    return f"{label or trial.recipe} {trial.pool} s{trial.seed} ({trial.trial_id})"[:240]


def trial_params(trial: TrialSpec) -> dict[str, str]:
    """Every axis value, then the seed and resolved overrides that are not axes (string values)."""
    params = {k: str(v) for k, v in trial.axes}  # a derived trial's --set values come last: they win
    params["pool"] = trial.pool  # the pool it runs on (a derived trial may move)
    params.setdefault("seed", str(trial.seed))
    params.setdefault("steps", str(trial.steps))
    for key, value in trial.overrides:
        params.setdefault(key, str(value))
    return {param_key(k): v[:6000] for k, v in params.items()}


def trial_tags(trial: TrialSpec, pool: PoolSpec, parent_run_id: str | None) -> dict[str, str]:
    tags = {ROLE_TAG: "trial", "trial_id": trial.trial_id, "grid": trial.grid,
            "backend": trial.backend, "recipe": trial.recipe, "seed": str(trial.seed),
            "pool": pool.name, "pool.kind": pool.kind, "accelerator": pool.accelerator,
            "mlflow.runName": trial_run_name(trial), **provenance_tags(),
            AXES_TAG: json.dumps([list(a) for a in trial.axes], ensure_ascii=False)}
    if trial.config:
        tags[CONFIG_TAG] = trial.config
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    if pool.kind == "gpu":
        tags["pool.gpus_per_node"], tags["pool.nodes"] = str(pool.gpus_per_node), str(pool.nodes)
        if pool.kueue_flavor:
            tags["pool.kueue_flavor"] = pool.kueue_flavor
    for key, value in trial.overrides:
        if key.startswith("rollout."):  # inference-engine flags
            tags[f"engine.{key.removeprefix('rollout.')}"] = str(value)
    if trial.derived_from:
        parent, step = trial.derived_from
        tags["derived_from"] = f"{parent}@{step}"
    return tags


def attempt_tags(attempts: Sequence[Attempt], steps: int, pool: PoolSpec | None) -> dict[str, str]:
    """Tags per attempt (pool, step range, outcome), the pool per step range and the cost."""
    tags: dict[str, str] = {"attempts": str(len(attempts)),
                            "pools": ",".join(dict.fromkeys(a.pool for a in attempts))}
    for a in attempts:
        end = "" if a.end_step is None else str(a.end_step)
        tags[f"attempt.{a.number}.pool"] = a.pool
        tags[f"attempt.{a.number}.steps"] = f"{a.start_step}-{end}"
        tags[f"attempt.{a.number}.outcome"] = a.outcome or "running"
        if a.resumed_from_step is not None:
            tags[f"attempt.{a.number}.resumed_from_step"] = str(a.resumed_from_step)
    # The run's one step axis by pool, e.g. "sim-a100:1-6,sim-h20:7-" (what compare draws).
    tags["pool_steps"] = ",".join(f"{p}:{lo}-{'' if hi is None else hi}"
                                  for p, lo, hi in effective_ranges(attempts))
    if len(attempts) > 1:
        prev = attempts[-2]
        tags["resumed_from"] = f"attempt {prev.number} on {prev.pool} at step {attempts[-1].start_step - 1}"
    # Attempts carry their pool's rate; the run's pool covers attempts recorded before that.
    tags.update(cost_tags(trial_cost(attempts, steps,
                                     pools={pool.name: pool} if pool is not None else None)))
    return tags


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
                run = mlc.create_run(self.experiment_id, run_name=trial_run_name(self.trial),
                                     start_time=self.outbox.started_ms,
                                     tags=trial_tags(self.trial, self.pool, self.parent_run_id))
                self.outbox.run_id = run.info.run_id
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


def drain(buffer_dir: Path, tracking_uri: str, timeout: float = 30) -> bool:
    """Send the outbox of a run whose process is gone (pending metrics, tags, artifacts, end)."""
    outbox = Outbox(Path(buffer_dir))
    if outbox.run_id is None:
        return outbox.empty()
    run = TrialRun.__new__(TrialRun)  # no trial/pool needed: the run exists, only the outbox is sent
    run._bind(tracking_uri, "", None, outbox, connected=True)
    return run.flush(timeout)
