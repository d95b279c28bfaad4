"""Backends run one attempt of a trial. One small interface (``base.Backend``), one module each:
``sim``, ``verl`` (with ``verl_map``, the vocabulary in verl's keys, and ``verl_topology``, world
size and checkpoint portability), ``k8s`` (the verl job as a KubeRay RayJob) and ``slurm`` (the
sim or verl job as a Slurm batch job).

A backend's module is imported when a grid first names it (``backend_class``), not with this
package: the simulator's trainer pulls in torch and verl's job pulls in verl, while ``ablate
plan`` only needs the class for its plan-time checks. ``_REGISTRY`` holds (module, class) names,
so a Ray worker imports the same class by name (tests register doubles there).
"""
from __future__ import annotations

import importlib
from typing import Any

from orchestrator.backends.base import AttemptOutcome, AttemptResult, Backend, RunContext

_REGISTRY: dict[str, tuple[str, str]] = {
    "sim": ("orchestrator.backends.sim", "SimBackend"),
    "verl": ("orchestrator.backends.verl", "VerlBackend"),
    "k8s": ("orchestrator.backends.k8s", "K8sBackend"),
    "slurm": ("orchestrator.backends.slurm", "SlurmBackend"),
}

__all__ = ["AttemptOutcome", "AttemptResult", "Backend", "RunContext", "backend_class"]


def backend_class(name: str) -> Any:
    """The backend class registered as ``name``."""
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)
