"""A ``cpu`` platform for verl's platform registry (``verl.plugin.platform``, new in 0.9).

verl asks the platform for its device name, device module, communication backend and Ray
resource. On a CPU-only host verl's auto-detection finds no accelerator and falls back to
``nvidia`` (``platform_manager._detect_platform_name``), so tensors would go to ``cuda`` and
process groups to NCCL. This platform answers instead:

* device ``cpu``, device module :mod:`orchestrator.verl.cpu.cpu_device`, backend ``gloo``;
* Ray resource ``GPU``: verl's resource pools hard-code ``use_gpu=True`` and place each worker on
  a bundle ``{"CPU": ..., "GPU": 1}`` (``single_controller/ray/base.py``). Starting Ray with fake
  GPUs (``+ray_kwargs.ray_init.num_gpus=N``) makes those bundles schedulable, one per rank. Ray
  then sets ``CUDA_VISIBLE_DEVICES`` in each worker, which CPU torch ignores.

The platform is registered under the name ``cpu`` and chosen with verl's own switch,
``VERL_PLATFORM=cpu``, so loading this plugin on a GPU host changes nothing.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from verl.plugin.platform import PlatformBase, PlatformRegistry

from orchestrator.verl.cpu import cpu_device

PLATFORM_NAME = "cpu"


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's accelerator interface answered by the host CPU."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a CPU exists everywhere, so only VERL_PLATFORM=cpu selects it.
        return False

    def current_device(self) -> str:  # type: ignore[override]  # torch.cpu's convention
        return cpu_device.current_device()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        cpu_device.set_device(device_index)

    def synchronize(self, device_index: int | None = None) -> None:
        cpu_device.synchronize()

    def manual_seed(self, seed: int) -> None:
        cpu_device.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        cpu_device.manual_seed_all(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """``expandable_segments`` and friends are CUDA caching-allocator options."""

    def empty_cache(self) -> None:
        cpu_device.empty_cache()

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for the fake GPUs; verl reads it back when building worker groups.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        # CUDA IPC handles do not exist; the CPU rollout receives weights through Ray instead.
        return False

    def cudart(self) -> Any:
        return None
