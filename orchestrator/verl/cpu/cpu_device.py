"""The ``torch.cuda``-shaped device module verl calls through ``get_torch_device()`` on CPU.

verl 0.9.1 calls these names on the device module (``grep -o "get_torch_device()\\.\\w*"``):
empty_cache, synchronize, is_available, current_stream, stream, Stream, Event, set_device,
device_count, mem_get_info, get_rng_state, set_rng_state, set_per_process_memory_fraction,
ipc_collect, memory_allocated, memory_reserved, max_memory_allocated, max_memory_reserved,
reset_peak_memory_stats, reset_accumulated_memory_stats, get_device_properties,
get_device_name, manual_seed(_all). ``torch.cpu`` has the stream / device half of them and none
of the memory / RNG half, so this module takes the first from ``torch.cpu`` and answers the
rest with CPU equivalents:

* memory figures are the process's host memory (RSS now, peak RSS as the "max" figures), so
  verl's ``perf/max_memory_allocated_gb`` reports something true instead of 0;
* ``mem_get_info`` is the host's (available, total), like ``cudaMemGetInfo`` for a device;
* the RNG is torch's CPU generator (verl's checkpoint saves it as ``"cpu"`` already and skips the
  device RNG when the device name is ``cpu``, ``utils/checkpoint/checkpoint_manager.py``);
* caching-allocator controls (empty_cache, ipc_collect, memory fraction) are no-ops: the CPU
  allocator has no cache to release.

``current_device()`` returns ``"cpu"`` like ``torch.cpu.current_device()``: verl moves tensors with
``tensor.to(get_device_id())`` and ``torch.device(get_device_id())`` (FSDP engine, fsdp_utils), and
an integer there would mean ``cuda:<n>``.
"""
from __future__ import annotations

import os
import platform as _platform
import resource
from types import SimpleNamespace
from typing import Any

import psutil
import torch

Stream = torch.cpu.Stream
Event = torch.cpu.Event
StreamContext = torch.cpu.StreamContext
stream = torch.cpu.stream
current_stream = torch.cpu.current_stream
synchronize = torch.cpu.synchronize
device_count = torch.cpu.device_count


def is_available() -> bool:
    """The CPU is this platform's device, and it is always there."""
    return True


def is_initialized() -> bool:
    return True


def current_device() -> str:
    return "cpu"


def set_device(device: Any) -> None:
    """Nothing to select: one CPU device per process (Ray gives each worker a fake GPU id)."""


def get_device_name(device: Any = None) -> str:
    # verl's flops counter matches this against its table of accelerators; "CPU" is not in it,
    # so MFU is reported against infinite peak flops (0), which is honest for a CPU.
    return f"CPU ({_platform.processor() or _platform.machine()})"


def get_device_capability(device: Any = None) -> tuple[None, None]:
    return None, None


def get_device_properties(device: Any = None) -> SimpleNamespace:
    total = psutil.virtual_memory().total
    return SimpleNamespace(name=get_device_name(), total_memory=total,
                           multi_processor_count=os.cpu_count() or 1, major=None, minor=None)


# --------------------------------------------------------------------------- memory


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    # ru_maxrss is in KiB on Linux; it can trail the current RSS by a few pages.
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, _rss())


def memory_allocated(device: Any = None) -> int:
    return _rss()


def memory_reserved(device: Any = None) -> int:
    return _rss()


def max_memory_allocated(device: Any = None) -> int:
    return _peak_rss()


def max_memory_reserved(device: Any = None) -> int:
    return _peak_rss()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def reset_peak_memory_stats(device: Any = None) -> None:
    """The kernel's peak RSS cannot be reset; the figure stays the process's lifetime peak."""


def reset_accumulated_memory_stats(device: Any = None) -> None:
    pass


def empty_cache() -> None:
    pass


def ipc_collect() -> None:
    pass


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    pass


# --------------------------------------------------------------------------- RNG


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(state)


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def seed_all() -> None:
    torch.seed()
