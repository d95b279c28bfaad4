"""The Kubernetes launcher: each attempt of a trial is one KubeRay RayJob running the verl job.

The job is exactly what the trainer runs locally (its ``TrainerJob``: same argv and
environment; the launcher has no ``version`` of its own, hence the same trial ids), and progress
is followed through the same job, from files on the shared checkpoint volume that the control
plane mounts at the trial pods' path:

* metrics: the job's metrics file of this attempt, read by ``TrainerJob.metrics`` (verl: its file
  logger, tailed and normalised) -> ``ctx.log_metrics``;
* checkpoints: the job's newest checkpoint is handed to ``ctx.save_checkpoint`` once its step's
  metrics are in (``TrainerJob.hand_over``; hard links when the orchestrator's workdir is on the
  same volume, as ``k8s/base/control.yaml`` sets it); a resume lays the stored checkpoint out as
  the job reads it (``TrainerJob.resume_path``);
* ``ctx.should_stop()`` (early stop, cancel) deletes the RayJob, which frees the GPUs;
* a failed RayJob raises ``InfraFailure`` with status, warning events and the driver's log tail.

Placement, names and pod hygiene are in ``orchestrator.k8s.render``; API calls in
``orchestrator.k8s.client``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.backends.base import (
    PLAN,
    AttemptOutcome,
    AttemptResult,
    Launcher,
    Problem,
    RunContext,
    Trainer,
    TrainerJob,
    problem,
)
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import BackendUnavailableError, InfraFailure, UserError
from orchestrator.k8s.client import Phase, RayJobClient, load_config
from orchestrator.k8s.render import check_pool, pool_image, render_rayjob
from orchestrator.k8s.settings import ClusterSettings
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

log = logging.getLogger(__name__)


class K8sLauncher(Launcher):
    """verl 0.9.1 trials as RayJobs on labelled GPU node pools (KubeRay + Kueue)."""

    name: ClassVar[str] = "k8s"
    pool_kinds: ClassVar[tuple[str, ...] | None] = ("gpu",)
    # The orchestrator runs in the control RayCluster and reaches the checkpoint store there.
    stores_here: ClassVar[bool] = False
    poll_seconds: ClassVar[float] = 15.0

    def __init__(
        self,
        *,
        settings: Any = None,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._client = client
        self._sleep = sleep

    @classmethod
    def problems(cls, trainer: type[Trainer], config: TrialConfig, *,
                 stages: frozenset[str] = PLAN) -> list[Problem]:
        """What the dry run and a submission check of a pool (``render.check_pool``: node
        labels, Kueue flavour, CPUs and memory per node: ``pool``), and the image a trial of
        its engine runs there (``config``)."""
        found: list[Problem] = []
        if "pool" in stages:
            try:
                check_pool(config.pool)
            except UserError as exc:
                text = str(exc)  # "pools.NAME[.KEY][:] ...": the catalogue key, for its line
                match = re.match(rf"pools\.{re.escape(config.pool.name)}(?:\.(\w+))?(: )?",
                                 text)
                key = (match.group(1) or "") if match else ""
                found.append(Problem("pool", text[match.end():] if match and match.group(2)
                                     else text, key))
        if "config" in stages:
            found += problem("config", cls._image_problem(trainer, config))
        return found

    @classmethod
    def _image_problem(cls, trainer: type[Trainer], config: TrialConfig) -> str | None:
        """The image a trial of this engine runs on its pool (``render.pool_image``, from the
        pool's ``images``/``image`` or ``ABLATE_K8S_IMAGE``), checked as the dry run checks it.
        An image given nowhere yet passes here: it comes from the environment of the process
        that submits (``ABLATE_K8S_IMAGE``), which the dry run and the submission check."""
        pool, job = config.pool, trainer.job(config)
        if job is None:
            return f"pool {pool.name}: trainer {trainer.name!r} runs no job a RayJob can hold"
        engine = str(job.engine)
        settings = ClusterSettings.from_env()
        if not (pool.images.get(engine) or pool.image or settings.image):
            return None
        try:
            pool_image(pool, settings, engine)
        except UserError as exc:
            return str(exc)
        return None

    @classmethod
    def require(cls, trainer: type[Trainer], pools: Iterable[PoolSpec], *,
                where: str = "") -> None:
        """The kubernetes client and credentials for the cluster, before anything starts:
        without them every trial would wait forever as "pending" on no cluster."""
        head = f"{where}: " if where else ""
        try:
            import kubernetes  # noqa: F401 - the k8s extra
        except ModuleNotFoundError:
            raise BackendUnavailableError(
                f"{head}backend k8s needs the kubernetes client, which is not installed; fix: "
                "pip install -e '.[k8s]' (or `--dry-run` to only write the manifests)") from None
        try:
            load_config()
        except BackendUnavailableError as exc:
            raise BackendUnavailableError(f"{head}backend k8s: {exc} (or `--dry-run` to only "
                                          "write the manifests)") from None

    @classmethod
    def dry_run(cls, grid_path: str, *, out_dir: str | None, force: bool,
                workdir: str | None, backend: str = "k8s") -> int:
        """Every manifest of every trial (``k8s/dryrun.py``); ``workdir`` is the cluster's."""
        from orchestrator.k8s.dryrun import dry_run  # deferred: it loads grids, above launchers

        return int(dry_run(grid_path, out_dir=out_dir, force=force, backend=backend) or 0)

    def run(self, trainer: Trainer, trial: TrialSpec, config: TrialConfig,
            ctx: RunContext) -> AttemptResult:
        settings = self._settings or ClusterSettings.from_env()
        if not Path(settings.checkpoint_root).is_dir():
            raise BackendUnavailableError(
                f"the checkpoint volume is not mounted at {settings.checkpoint_root} here; run "
                "`ablate submit` in the control RayCluster (k8s/README.md) or mount the volume "
                "at that path (ABLATE_K8S_CHECKPOINT_ROOT)"
            )
        ckpt_dir = Path(settings.checkpoint_dir(trial.grid, trial.trial_id))
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        job = trainer.job(config)
        if job is None:
            raise BackendUnavailableError(f"backend k8s: trainer {trainer.name!r} runs no job a "
                                          "RayJob can hold")
        resume_path = job.resume_path(ctx, ckpt_dir)
        manifest = render_rayjob(
            trial,
            config,
            ctx.pool,
            settings=settings,
            attempt=ctx.attempt,
            run_id=getattr(ctx, "mlflow_run_id", None),
            resume_path=resume_path,
            job=job,
            save_freq=ctx.checkpoint_every,
        )
        name = manifest["metadata"]["name"]
        client = self._client or RayJobClient(settings.namespace)
        client.create(manifest)
        try:
            return self._follow(client, name, trial, ctx, settings, ckpt_dir, job)
        except InfraFailure:
            raise  # the job ended by itself; its cluster stays for ttlSecondsAfterFinished
        except BaseException:
            # We stop watching (error, interrupt): never leave GPUs running unobserved, since
            # a retry submits a new attempt.
            _delete_quietly(client, name)
            raise

    def _follow(
        self,
        client: Any,
        name: str,
        trial: TrialSpec,
        ctx: RunContext,
        settings: Any,
        ckpt_dir: Path,
        job: TrainerJob,
    ) -> AttemptResult:
        tail = job.metrics(Path(settings.metrics_path(trial.grid, trial.trial_id, ctx.attempt)),
                           ctx.resume_step or 0)
        saved = fed = ctx.resume_step or 0  # fed: the last step given to the run context
        reason = None
        while True:
            state = client.state(name)
            finished = state is None or state.phase.finished
            for step, data in tail.poll() + (tail.flush() if finished else []):
                # The job runs ahead of this loop: once the context asks to stop, no later
                # step is recorded, as an in-process trainer would not run it.
                reason = reason or ctx.should_stop()
                if reason:
                    break
                ctx.log_metrics(step, data)
                fed = step
            saved = job.hand_over(ctx, ckpt_dir, saved, fed)
            reason = reason or (None if finished else ctx.should_stop())
            if reason:
                if not finished:
                    client.delete(name)
                return AttemptResult(AttemptOutcome.STOPPED, fed, reason)
            if finished:
                break
            self._sleep(self.poll_seconds)
        last = fed
        if state is None:
            raise InfraFailure(
                f"infra_failure: RayJob {settings.namespace}/{name} disappeared "
                f"after step {last} (deleted outside the orchestrator?)"
            )
        if state.phase is Phase.STOPPED:
            return AttemptResult(
                AttemptOutcome.STOPPED,
                last,
                f"Ray job stopped outside the orchestrator ({state.describe()})",
            )
        if state.phase is Phase.FAILED:
            raise InfraFailure(client.failure_reason(name, state))
        if last < trial.steps:
            raise InfraFailure(
                f"infra_failure: RayJob {settings.namespace}/{name} succeeded "
                f"after step {last} of {trial.steps} (data exhausted or a step "
                "was not logged)"
            )
        return AttemptResult(AttemptOutcome.COMPLETED, last)


def _delete_quietly(client: Any, name: str) -> None:
    try:
        client.delete(name)
    except Exception:  # the original error is the one to report
        log.exception("could not delete RayJob %s after an error", name)
