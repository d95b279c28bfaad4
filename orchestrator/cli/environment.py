"""``ablate env``: versions, devices and endpoints, for bug reports."""
from __future__ import annotations

import os
import platform
import sys
from typing import Any

from orchestrator.store import workspace

PACKAGES = ("rl-ablate", "torch", "ray", "mlflow", "optuna", "hydra-core", "omegaconf", "pydantic",
            "verl", "kubernetes")
# Rollout engines of gpu pools, installed here (the GPU stacks: `ablate gpu-env sglang|vllm`, each
# its own environment, listed as gpu_env.<stack>); listed as engine.<name>.
ENGINE_PACKAGES = {"sglang": "sglang", "vllm": "vllm"}


def _version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> str:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    if torch.cuda.is_available():
        names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
        return f"{torch.cuda.device_count()} CUDA GPU(s): {', '.join(sorted(names))}"
    return f"CPU only ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})"


def collect() -> dict[str, Any]:
    """A flat dict of environment facts (no secrets: only endpoint URIs without credentials)."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    for pkg in PACKAGES:
        info[pkg] = _version(pkg)
    for engine, pkg in ENGINE_PACKAGES.items():
        info[f"engine.{engine}"] = _version(pkg)
    # cpu: rl-ablate's own CPU rollout engine (cpu pools), always present.
    info["engines_installed"] = ", ".join(
        ["cpu"] + [e for e, p in ENGINE_PACKAGES.items() if _version(p) != "not installed"])
    info.update(gpu_envs())
    info["devices"] = _devices()
    info["workdir"] = str(workspace.workdir())
    info["mlflow_tracking_uri"] = _redact(workspace.tracking_uri())
    info["ray_address"] = _redact(os.environ.get("RAY_ADDRESS", "local (embedded, started on submit)"))
    info["kubeconfig"] = os.environ.get("KUBECONFIG", "~/.kube/config (if present)")
    return info


def gpu_envs() -> dict[str, str]:
    """Each GPU stack's environment (``ablate gpu-env``): state, place and the versions its stamp
    records (no subprocess: ``ablate env`` stays fast)."""
    import json  # only `ablate env` reads the stamps

    from orchestrator.verl import gpu_setup  # standard library only, but verl's package: deferred

    out = {}
    for stack in gpu_setup.STACKS:
        env = gpu_setup.env_dir(stack)
        state = gpu_setup.state(stack, env)
        versions = ""
        if state == "ready":
            recorded = json.loads((env / gpu_setup.STAMP).read_text()).get("versions", {})
            versions = ", ".join(f"{k} {v}" for k, v in sorted(recorded.items())) + "; "
        out[f"gpu_env.{stack}"] = (f"{state} ({versions}{env})" if state != "not created" else
                                   f"not created ({gpu_setup.SETUP_COMMAND.format(stack=stack)})")
    return out


def _redact(uri: str) -> str:
    """Drop ``user:password@`` from a URI."""
    if "://" in uri and "@" in uri.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = uri.split("://", 1)
        host = rest.split("@", 1)[1]
        return f"{scheme}://***@{host}"
    return uri
