"""Cluster-side settings shared by the renderer, the client and ``k8s/base`` (same defaults).

Defaults match the kustomization in ``k8s/base``; each can be overridden by an environment
variable (``ABLATE_K8S_*``) so the control-plane pod and a laptop render the same objects.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from orchestrator.exceptions import UserError
from orchestrator.k8s import names

# Labels every rendered object carries (also what the client selects pods by).
LABEL_PREFIX = "ablate.io"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rl-ablate"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU_RESOURCE = "nvidia.com/gpu"

# Kubernetes quantities in the forms this project writes (pools.yaml, the settings below): one
# parser for every quantity a manifest gets, used at plan time and by the render alike.
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
          "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def parse_memory(text: str | None, what: str) -> int:
    """Bytes in a Kubernetes memory quantity such as ``1600Gi`` (the forms pools.yaml uses)."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|K|M|G|T)?", text or "")
    if not m or int(m.group(1)) == 0:
        raise UserError(f"{what} {text!r} is not a memory quantity; fix: write e.g. 512Gi")
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def parse_cpu(text: str, what: str) -> float:
    """CPUs in a Kubernetes CPU quantity: whole CPUs (``4``) or millicores (``500m``)."""
    m = re.fullmatch(r"(\d+)(m?)", text or "")
    if not m or int(m.group(1)) == 0:
        raise UserError(f"{what} {text!r} is not a CPU quantity; fix: write e.g. 4 or 500m")
    return int(m.group(1)) / (1000 if m.group(2) else 1)


@dataclasses.dataclass(frozen=True)
class SecretEnv:
    """An environment variable filled from a Secret key (never a literal value)."""

    env: str
    secret: str
    key: str
    optional: bool = True


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """Where trials run and what they mount. See ``k8s/README.md`` for the objects named here."""

    namespace: str = "ablate"
    local_queue: str = "ablate-trials"
    trial_service_account: str = "ablate-trial"
    tracking_uri: str = "http://mlflow.ablate.svc.cluster.local:5000"
    checkpoint_claim: str = "ablate-checkpoints"
    checkpoint_root: str = "/ablate/checkpoints"
    image: str | None = None  # used when a pool names no image
    control_image: str = "rl-ablate/control:latest"  # k8s/images/control (kustomize images:)
    head_cpu: str = "4"
    head_memory: str = "16Gi"
    submitter_cpu: str = "500m"
    submitter_memory: str = "512Mi"
    worker_fraction: float = 0.9  # share of a node's CPU/memory a worker pod requests
    shm_size: str = "32Gi"
    ttl_seconds_after_finished: int = 600  # keep the finished cluster this long for inspection
    active_deadline_seconds: int | None = None
    run_as_user: int = 1000  # uid of the `ray` user in the rayproject images
    # Extended resource a worker requests per GPU; None only for CPU-only dummy pools (kind).
    gpu_resource: str | None = GPU_RESOURCE
    secret_env: tuple[SecretEnv, ...] = (
        SecretEnv("HF_TOKEN", "ablate-hf-token", "token"),
        SecretEnv("MLFLOW_TRACKING_USERNAME", "ablate-mlflow-auth", "username"),
        SecretEnv("MLFLOW_TRACKING_PASSWORD", "ablate-mlflow-auth", "password"),
    )

    def __post_init__(self) -> None:
        names.check_dns_label(self.namespace, "namespace (ABLATE_K8S_NAMESPACE)")
        names.check_label_value(self.local_queue, "Kueue LocalQueue (ABLATE_K8S_QUEUE)")
        names.check_dns_label(self.local_queue, "Kueue LocalQueue (ABLATE_K8S_QUEUE)")
        names.check_subdomain(self.trial_service_account, "trial ServiceAccount")
        names.check_subdomain(
            self.checkpoint_claim, "checkpoint PVC (ABLATE_K8S_CHECKPOINT_CLAIM)"
        )
        if not self.checkpoint_root.startswith("/") or ".." in self.checkpoint_root.split("/"):
            raise UserError(
                f"checkpoint root {self.checkpoint_root!r} must be an absolute "
                "path without '..'; fix: set ABLATE_K8S_CHECKPOINT_ROOT"
            )
        for name in ("head_cpu", "submitter_cpu"):
            parse_cpu(getattr(self, name), f"cluster setting {name}")
        for name in ("head_memory", "submitter_memory", "shm_size"):
            parse_memory(getattr(self, name), f"cluster setting {name}")
        if not 0.1 <= self.worker_fraction <= 1.0:
            raise UserError(f"worker_fraction {self.worker_fraction} must be in [0.1, 1]")
        for s in self.secret_env:
            names.check_env_name(s.env)
            names.check_subdomain(s.secret, f"Secret for {s.env}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClusterSettings:
        """Defaults, overridden by ``ABLATE_K8S_*`` variables that are set."""
        env = os.environ if environ is None else environ
        keys = {
            "namespace": "ABLATE_K8S_NAMESPACE",
            "local_queue": "ABLATE_K8S_QUEUE",
            "tracking_uri": "ABLATE_K8S_TRACKING_URI",
            "checkpoint_claim": "ABLATE_K8S_CHECKPOINT_CLAIM",
            "checkpoint_root": "ABLATE_K8S_CHECKPOINT_ROOT",
            "image": "ABLATE_K8S_IMAGE",
            "control_image": "ABLATE_K8S_CONTROL_IMAGE",
        }
        given = {field: env[var] for field, var in keys.items() if env.get(var)}
        return cls(**given)

    def trial_dir(self, grid: str, trial_id: str) -> str:
        """The trial's directory on the shared checkpoint volume (same path in every pod)."""
        return f"{self.checkpoint_root}/{grid}/{trial_id}"

    def checkpoint_dir(self, grid: str, trial_id: str) -> str:
        return f"{self.trial_dir(grid, trial_id)}/ckpt"

    def metrics_root(self, grid: str, trial_id: str, attempt: int) -> str:
        # verl's file logger truncates its file on start: one directory per attempt.
        return f"{self.trial_dir(grid, trial_id)}/logs/attempt-{attempt}"

    def metrics_path(self, grid: str, trial_id: str, attempt: int) -> str:
        """Where verl's file logger writes: ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``
        with project = grid and experiment = trial id (``VerlTrainer.overrides``)."""
        return f"{self.metrics_root(grid, trial_id, attempt)}/{grid}/{trial_id}.jsonl"
