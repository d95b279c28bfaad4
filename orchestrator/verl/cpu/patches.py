"""The patches to verl that running on CPU forces, each one named function, verl 0.9.1 only.

Every patch checks the installed verl version and the exact source it works around, and raises
:class:`UnsupportedVerlVersion` if either differs: a patch that silently stops matching the code it
was written for is worse than a loud failure. Everything else the CPU run needs goes through
verl's extension points (platform registry, rollout registries, ``VERL_ENGINE_DEVICE``,
Hydra overrides); see ``orchestrator/verl/cpu/plugin.py``.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

SUPPORTED_VERL = "0.9.1"


class UnsupportedVerlVersion(RuntimeError):
    """The installed verl is not the one these patches were written against."""


def require_verl(version: str = SUPPORTED_VERL) -> None:
    import verl

    found = getattr(verl, "__version__", None)
    if found != version:
        raise UnsupportedVerlVersion(
            f"the verl_cpu backend patches verl {version}, but verl {found} is installed: re-check "
            "every patch in orchestrator/verl/cpu/patches.py against that version before using it")


def _require_source(func: Callable[..., Any], needle: str, where: str) -> None:
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as exc:
        raise UnsupportedVerlVersion(f"cannot read the source of {where}: {exc}") from None
    if needle not in source:
        raise UnsupportedVerlVersion(f"{where} no longer contains {needle!r}; the patch for it "
                                     "would not do what it says")


def use_gloo_only_process_group() -> None:
    """Give verl's workers a gloo-only default process group when the device is the CPU.

    Works around verl 0.9.1 ``verl/utils/distributed.py:88``
    (``initialize_global_process_group_ray``), called with no backend by ``TrainingWorker``
    (``verl/workers/engine_workers.py:89``)::

        backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"

    With the CPU platform that string is ``"cpu:gloo,cpu:gloo"`` and torch refuses it
    ("Duplicate device type cpu"). No platform answer avoids it: the device name must be ``cpu``
    for tensors to land on the CPU. The wrapper passes ``backend="gloo"`` when the device is the
    CPU and the caller gave none, and leaves every other call unchanged.

    ``engine_workers`` binds the function by name at import, so the module attribute is replaced
    before that import (the plugin runs while ``import verl`` runs) and, if it was already
    imported, its binding is replaced too.
    """
    require_verl()
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    if getattr(original, "__ablate_patched__", False):
        return
    _require_source(original, 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
                    "verl.utils.distributed.initialize_global_process_group_ray")

    def initialize_global_process_group_ray(timeout_second: Any = None, backend: Any = None) -> Any:
        if backend is None and dist_utils.get_device_name() == "cpu":
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray.__ablate_patched__ = True  # type: ignore[attr-defined]
    initialize_global_process_group_ray.__wrapped__ = original  # type: ignore[attr-defined]
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray
    for name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


def apply_all() -> None:
    """Apply every patch (each one checks the verl version first)."""
    use_gloo_only_process_group()
