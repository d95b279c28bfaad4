"""The CPU platform answers verl's device questions; the patch refuses other verl versions."""
from __future__ import annotations

import pytest

verl = pytest.importorskip("verl")

from orchestrator.verl.cpu import cpu_device, patches
from orchestrator.verl.cpu.platform import PlatformCPU


def test_platform_answers():
    p = PlatformCPU()
    assert (p.device_name, p.communication_backend_name(), p.ray_resource_name()) == ("cpu", "gloo", "GPU")
    assert p.device_module is cpu_device
    assert p.ray_resource_options(1) == {"num_gpus": 1}
    assert not p.is_platform_available(use_smi_check=True)  # only VERL_PLATFORM=cpu selects it
    import torch

    assert torch.zeros(1).to(p.current_device()).device.type == "cpu"


def test_device_module_memory_and_rng():
    import torch

    assert cpu_device.max_memory_allocated() >= cpu_device.memory_allocated() > 0
    free, total = cpu_device.mem_get_info()
    assert 0 < free <= total
    state = cpu_device.get_rng_state()
    a = torch.rand(1)
    cpu_device.set_rng_state(state)
    assert torch.equal(a, torch.rand(1))


def test_patch_refuses_other_verl(monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(patches.UnsupportedVerlVersion):
        patches.use_gloo_only_process_group()


def test_patch_picks_gloo_only_on_cpu(monkeypatch):
    import torch.distributed
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda backend, **kw: calls.append(backend))
    try:
        patches.use_gloo_only_process_group()
        patched = dist_utils.initialize_global_process_group_ray
        monkeypatch.setattr(dist_utils, "get_device_name", lambda: "cpu")
        patched()
        patched(backend="cpu:gloo")  # an explicit backend is left alone
        monkeypatch.setattr(dist_utils, "get_device_name", lambda: "cuda")
        patched()  # not the CPU: verl's own default string
        assert calls[:2] == ["gloo", "cpu:gloo"] and calls[2].startswith("cpu:gloo,cuda:")
        patches.use_gloo_only_process_group()  # idempotent
        assert dist_utils.initialize_global_process_group_ray is patched
    finally:
        dist_utils.initialize_global_process_group_ray = original
