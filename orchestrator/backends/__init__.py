"""Backends run one attempt of a trial. One small interface (``base.Backend``), one module each.

Modules are imported lazily (the sim pulls in torch, verl pulls in verl): ``ablate plan`` only
imports the class to call its plan-time ``check``.
"""
from __future__ import annotations

import importlib
from typing import Any

from orchestrator.backends.base import AttemptOutcome, AttemptResult, Backend, RunContext

_REGISTRY: dict[str, tuple[str, str]] = {
    "sim": ("orchestrator.backends.sim", "SimBackend"),
    "verl": ("orchestrator.backends.verl", "VerlBackend"),
    "k8s": ("orchestrator.backends.k8s", "K8sBackend"),
}

__all__ = ["AttemptOutcome", "AttemptResult", "Backend", "RunContext", "backend_class", "names"]


def names() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> Any:
    """The backend class for ``name``, or ``None`` if that backend is not built yet."""
    module, cls = _REGISTRY[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise
    return getattr(mod, cls)
