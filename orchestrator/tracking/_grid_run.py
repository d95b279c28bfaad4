"""The grid's side of MLflow: one experiment per grid (``experiment_for``), the parent run of a
submission (``GridRun``, ``parent_run``) and where the submission's trial runs go
(``TrackingTarget``).

Apart from the trial runs (``_runs``) because a submission opens this once, in the
orchestrator, while a trial's run is fed from the attempt's process through its outbox.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.exceptions import UserError
from orchestrator.store import workspace
from orchestrator.tracking._labels import _tags, provenance_tags
from orchestrator.tracking._orphans import (
    close_orphaned_parents,
    process_tags,
    retire_orphaned_trial_runs,
)
from orchestrator.tracking._store import (
    ROLE_TAG,
    client,
    fail_fast,
    is_permanent,
    is_remote,
    use_wal,
)
from orchestrator.tracking._summaries import publish_summaries
from orchestrator.tracking._views import save_trials_view

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from orchestrator.grid import GridSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrackingTarget:
    """Where the trial's MLflow child run lives (the parent run is the grid submission)."""

    uri: str
    experiment_id: str  # "" while the orchestrator is still opening the parent run
    parent_run_id: str | None


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
                retire_orphaned_trial_runs(mlc, exp_id, workspace.grid_dir(grid.name, workdir),
                                           keep=run.info.run_id)
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

    def publish_summaries(self, grid: str, grid_dir: Path) -> int:
        """The grid's summary table (its finished trials') as an artifact of this run
        (``_summaries``); never fails the caller."""
        return publish_summaries(client(self.tracking_uri), self.run_id, grid, grid_dir)

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
    parent.publish_summaries(grid.name, workspace.grid_dir(grid.name, workdir))
    parent.end("FINISHED")
