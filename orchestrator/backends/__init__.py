"""The seam between the grid and what runs it: a grid's ``backend:`` names a trainer (what
trains, ``base.Trainer``: ``orchestrator.sim.job``, ``orchestrator.verl.trainer``) and a
launcher (where an attempt runs, ``base.Launcher``: ``local`` here, ``orchestrator.k8s.launcher``,
``orchestrator.slurm.launcher``). ``backend(name)`` returns the pair as one ``Backend``, which
``grid/``, ``run/`` and ``scheduler/`` ask everything they used to ask a backend name.

Trainers and launchers are imported when first asked (``Backend.trainer``), not with this
package: the simulator's trainer pulls in torch and verl's job pulls in verl, while ``ablate
plan`` only needs their plan-time checks. The tables hold (module, class) names, so a Ray
worker imports the same class by name; tests register doubles in ``_TRAINERS``.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.backends.base import (
        AttemptOutcome,
        AttemptResult,
        Evaluator,
        Launcher,
        MetricReader,
        ProbeJob,
        Problem,
        RunContext,
        Trainer,
        TrainerJob,
    )
    from orchestrator.backends.config import TrialConfig
    from orchestrator.pools import PoolSpec
    from orchestrator.trial import TrialSpec

# Imported on first use (PEP 562), as the trainers are: the interfaces pull in the grid's
# schema library, which a command that only reads records (``ablate status``) does without.
_FROM_BASE = ("AttemptOutcome", "AttemptResult", "Emits", "Evaluator", "Launcher",
              "MetricReader", "Problem", "ProbeJob", "RunContext", "Trainer", "TrainerJob")


def __getattr__(name: str) -> Any:
    if name in _FROM_BASE:
        from orchestrator.backends import base  # deferred: see the comment above

        return getattr(base, name)
    if name == "TrialConfig":
        from orchestrator.backends import config  # deferred: see the comment above

        return config.TrialConfig
    raise AttributeError(f"module 'orchestrator.backends' has no attribute {name!r}")

_TRAINERS: dict[str, tuple[str, str]] = {
    "sim": ("orchestrator.sim.job", "SimTrainer"),
    "verl": ("orchestrator.verl.trainer", "VerlTrainer"),
    "miles": ("orchestrator.miles.trainer", "MilesTrainer"),
}
# A trainer's probe job (``base.ProbeJob``), by trainer name: kept apart from the trainer class
# so that adding one changes no module whose content hashes a committed result.
_PROBES: dict[str, tuple[str, str]] = {
    "sim": ("orchestrator.sim.probe_job", "SimProbe"),
    "verl": ("orchestrator.probe.verl_job", "VerlProbe"),
}
# A trainer's reference evaluator (``base.Evaluator``), by trainer name: one without has every
# reference refused.
_EVALUATORS: dict[str, tuple[str, str]] = {
    "sim": ("orchestrator.sim.evaluator", "SimEvaluator"),
    "verl": ("orchestrator.verl.reference_job", "VerlEvaluator"),
}
_LAUNCHERS: dict[str, tuple[str, str]] = {
    "local": ("orchestrator.backends.local", "LocalLauncher"),
    "k8s": ("orchestrator.k8s.launcher", "K8sLauncher"),
    "slurm": ("orchestrator.slurm.launcher", "SlurmLauncher"),
}
# A grid's ``backend:`` -> (its trainers, by pool kind in this order; its launcher). Besides
# these, every trainer is a backend of its own name, launched here (``_pairs``; Miles: a Ray
# job on the pool's Ray cluster, submitted from here), so a new trainer is its package and one
# line in _TRAINERS. Grid files keep their spelling: ``k8s`` and ``slurm`` mean "launched there".
_BACKENDS: dict[str, tuple[tuple[str, ...], str]] = {
    "k8s-miles": (("miles",), "k8s"),
    "k8s": (("verl",), "k8s"),
    "slurm": (("sim", "verl"), "slurm"),  # sim pools run the simulator, cpu/gpu pools verl
    "slurm-miles": (("miles",), "slurm"),  # Ray started in the allocation, train.py its driver
}

__all__ = ["AttemptOutcome", "AttemptResult", "Backend", "Emits", "Evaluator", "Launcher",
           "MetricReader", "Problem", "RunContext", "Trainer", "TrainerJob", "TrialConfig",
           "backend", "launched_on", "names", "on_launcher", "trainer_names", "trainers_of"]


def _pairs() -> dict[str, tuple[tuple[str, ...], str]]:
    """Every backend: each trainer's own (launched here), then the launchers' pairings."""
    return {**{name: ((name,), "local") for name in _TRAINERS}, **_BACKENDS}


def _load(ref: tuple[str, str]) -> Any:
    module, cls = ref
    return getattr(importlib.import_module(module), cls)


def names() -> tuple[str, ...]:
    """The backend names a grid may give (``backend:``, ``--backend``)."""
    return tuple(_pairs())


def trainers_of(name: str) -> tuple[str, ...]:
    """The trainers backend ``name`` runs (``slurm``: the simulator and verl, by pool kind)."""
    return _pairs()[name][0]


def trainer_names() -> tuple[str, ...]:
    """Every trainer a backend may run (a grid's ``recipe:`` by trainer, a rule's ``trainer:``)."""
    return tuple(_TRAINERS)


def on_launcher(name: str, launcher: str) -> str:
    """The backend that runs backend ``name``'s trainers with ``launcher`` (``miles`` on ``k8s``:
    ``k8s-miles``), else the launcher's own default pairing (``k8s``: verl)."""
    pairs = _pairs()
    trainers = pairs[name][0]
    for other, (theirs, where) in pairs.items():
        if where == launcher and theirs == trainers:
            return other
    return launcher


def launched_on(given: str, file_backend: str | None) -> str:
    """The backend a ``--backend`` given on the command line means for a grid whose file says
    ``file_backend``: a launcher's own name (``k8s``, ``slurm``) launches the file's trainers
    there (a Miles grid with ``--backend slurm`` is ``slurm-miles``); any other name is itself."""
    pairs = _pairs()
    if file_backend in pairs and pairs.get(given, ((), ""))[1] == given:
        return on_launcher(file_backend, given)
    return given


def backend(name: str) -> Backend:
    """The trainer(s) and launcher a grid's ``backend: name`` runs, as registered now (a test's
    double included: the driver ships these names to its workers)."""
    trainers, launcher = _pairs()[name]
    return Backend(name, tuple((t, _TRAINERS[t]) for t in trainers), _LAUNCHERS[launcher])


@dataclasses.dataclass(frozen=True)
class Backend:
    """One grid backend: its trainers (the first whose ``pool_kinds`` holds a pool's kind runs
    that pool's trials) and its launcher, by (module, class) name. Plain data, so it travels to
    Ray workers and Slurm jobs; classes are imported on first use."""

    name: str
    trainer_refs: tuple[tuple[str, tuple[str, str]], ...]  # (registry name, (module, class))
    launcher_ref: tuple[str, str]

    # ------------------------------------------------------------------ the parts

    @property
    def trainers(self) -> tuple[type[Trainer], ...]:
        return tuple(_load(ref) for _, ref in self.trainer_refs)

    @property
    def launcher(self) -> type[Launcher]:
        return _load(self.launcher_ref)  # type: ignore[no-any-return]

    def trainer(self, pool: PoolSpec) -> type[Trainer]:
        """The trainer that runs ``pool``'s trials (its kind checked by ``pool_kinds``)."""
        for cls in self.trainers:
            if pool.kind in cls.pool_kinds:
                return cls
        return self.trainers[0]  # its own check refuses the pool, naming the kinds it runs on

    def probe_job(self, pool: PoolSpec) -> type[ProbeJob] | None:
        """The probe job of the trainer that runs ``pool``'s trials, or None if it has none."""
        ref = _PROBES.get(self.trainer(pool).name)
        return None if ref is None else _load(ref)  # type: ignore[no-any-return]

    @property
    def pool_kinds(self) -> tuple[str, ...]:
        """The pool kinds this backend runs on, its main kind first."""
        own = self.launcher.pool_kinds
        kinds = [k for cls in self.trainers for k in cls.pool_kinds]
        return own if own is not None else tuple(dict.fromkeys(kinds))

    @property
    def computes_elsewhere(self) -> bool:
        return self.launcher.computes_elsewhere or all(t.computes_elsewhere for t in self.trainers)

    @property
    def stores_here(self) -> bool:
        return self.launcher.stores_here

    # ------------------------------------------------------------------ identity

    def identity(self) -> dict[str, str]:
        """What a trial id hashes of its backend. Kept exactly as before trainers and launchers
        were apart, so stored trials keep their ids: a launcher that runs the trainer's own job
        (local, k8s) gives the trainer's name and version (k8s trials are verl trials); one that
        wraps it (Slurm's worker) its own name and ``version+trainer+...``."""
        version = self.launcher.version
        if version is None:
            (name, _), = self.trainer_refs
            return {"backend": name, "backend_version": self.trainers[0].version}
        return {"backend": self.name,
                "backend_version": "+".join([version, *(t.version for t in self.trainers)])}

    # ------------------------------------------------------------------ plan time

    def problems(self, config: TrialConfig, *, stages: frozenset[str] | None = None,
                 given: Iterable[tuple[str, Any]] = (), checkpoint: Path | None = None,
                 others: Iterable[PoolSpec] = ()) -> list[Problem]:
        """Every problem of a trial of ``config`` on its pool (``base.Trainer.problems``), stage
        by stage in :data:`base.STAGES` order: of a pool's own settings the trainer's first
        (what it computes with), of a trial's placement the launcher's (it is wrong for every
        trial of the pool)."""
        from orchestrator.backends.base import PLAN, STAGES  # deferred: see _FROM_BASE

        asked = PLAN if stages is None else stages
        trainer = self.trainer(config.pool)
        mine = trainer.problems(config, stages=asked, given=given, checkpoint=checkpoint,
                                others=others)
        theirs = self.launcher.problems(trainer, config, stages=asked)
        return sorted(mine + theirs, key=lambda p: (STAGES.index(p.stage), p.stage != "pool"
                                                    and p in mine))

    def problem(self, config: TrialConfig, stages: frozenset[str], **asked: Any) -> str | None:
        """The first of :meth:`problems` of ``stages``, or None."""
        found = self.problems(config, stages=stages, **asked)
        return found[0].reason if found else None

    def evaluator(self, pool: PoolSpec) -> Evaluator:
        """The reference evaluator of the trainer that runs ``pool``'s trials (one that refuses
        every reference where its trainer registered none)."""
        from orchestrator.backends.base import Evaluator  # deferred: see _FROM_BASE

        trainer = self.trainer(pool)
        ref = _EVALUATORS.get(trainer.name)
        return (Evaluator if ref is None else _load(ref))(trainer)  # type: ignore[no-any-return]

    def reported(self, name: str, pools: Iterable[PoolSpec]) -> bool:
        """Whether some trial on ``pools`` can ever report metric ``name`` (its trainer's)."""
        return any(self.trainer(p).emits().reports(name) for p in pools)

    def unemitted(self, config: TrialConfig) -> dict[str, str]:
        """Metrics a trial of ``config`` never emits on its pool, with why (its trainer's
        answer, whichever launcher runs it)."""
        return dict(self.trainer(config.pool).emits(config).unemitted)

    def describe(self, trial: TrialSpec, config: TrialConfig) -> list[str]:
        """What ``ablate plan --show-overrides`` prints: the launcher's lines (Slurm: the
        ``#SBATCH`` options), then the trainer's job's, or a trial run in-process's overrides
        as ``key=JSON`` lines."""
        job = self.trainer(config.pool).job(config)
        own = (job.describe(trial) if job is not None
               else [f"{k}={json.dumps(v, default=list)}" for k, v in trial.overrides])
        return self.launcher.describe(trial, config.pool) + own

    # ------------------------------------------------------------------ submit and run

    def require(self, pools: Iterable[PoolSpec], *, where: str = "") -> None:
        """Refuse one line early if this machine cannot launch trials on ``pools``."""
        by_trainer: dict[type[Trainer], list[PoolSpec]] = {}
        for pool in pools:
            by_trainer.setdefault(self.trainer(pool), []).append(pool)
        for cls, mine in (by_trainer or {self.trainers[0]: []}).items():
            self.launcher.require(cls, mine, where=where)

    def worker_env(self, config: Mapping[str, Any]) -> dict[str, str | None]:
        """The environment the orchestrator's workers start with (before Ray starts them)."""
        env: dict[str, str | None] = {}
        for cls in self.trainers:
            env.update(self.launcher.worker_env(cls, config))
        return env

    def abandon(self, trial_id: str, log_dir: Path) -> None:
        self.launcher.abandon(trial_id, log_dir)

    def dry_run(self, grid_path: str, *, out_dir: str | None, force: bool,
                workdir: str | None) -> int:
        """``ablate submit --dry-run``. A grid launched here hands nothing over, so its dry run
        writes the Kubernetes manifests it would run as (``--backend k8s``), as it always has."""
        status = self.launcher.dry_run(grid_path, out_dir=out_dir, force=force, workdir=workdir,
                                       backend=self.name)
        if status is None:
            status = _load(_LAUNCHERS["k8s"]).dry_run(grid_path, out_dir=out_dir, force=force,
                                                      workdir=workdir,
                                                      backend=on_launcher(self.name, "k8s"))
        return int(status or 0)

    def run(self, trial: TrialSpec, config: TrialConfig, ctx: RunContext) -> AttemptResult:
        """One attempt of ``trial`` on ``ctx.pool``: its trainer, launched by the launcher."""
        return self.launcher().run(self.trainer(ctx.pool)(), trial, config, ctx)
