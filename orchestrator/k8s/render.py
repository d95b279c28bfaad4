"""Render one KubeRay RayJob per trial attempt, pinned to the trial's GPU pool.

The trial's job is its trainer's own (``backends.base.TrainerJob``, from ``Trainer.job``): the
argv, the environment, the engine (its image) and the world size (its worker pods) come from
there, so k8s and verl runs of a trial do the same thing and share a trial id, and this package
imports no trainer. What this module adds is the placement and the pod hygiene:

* the GPU worker group is pinned to the pool by ``nodeSelector`` on the pool's node labels,
  which is also what makes Kueue assign only that pool's ResourceFlavor (Kueue skips a flavor
  whose ``nodeLabels`` do not match the pod's node selector; ``flavorassigner.go`` in Kueue
  v0.19.2). An ablation trial therefore never lands on another GPU type. Only an explicit
  resume attempt may list fallback pools of the same shape (``fallback_pools``);
* the entrypoint is ``shlex.join(argv)``: KubeRay pastes it into ``bash -c`` and Ray's job
  supervisor runs it through a shell again, so grid values must be quoted to stay data;
* every pod runs as non-root without privilege escalation, drops all capabilities, requests
  what it limits, mounts no host path, and gets secrets only through ``secretKeyRef``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.backends import TrainerJob, TrialConfig, backend
from orchestrator.exceptions import UserError
from orchestrator.k8s import names
from orchestrator.k8s.settings import (
    LABEL_PREFIX,
    MANAGED_BY,
    QUEUE_LABEL,
    ClusterSettings,
    parse_memory,
)
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec

RAYJOB_API = "ray.io/v1"
# What a pool's image for a job of each engine holds (the error that asks for one says so).
IMAGE_HOLDS = {"sglang": "verl[sglang]==0.9.1", "vllm": "verl[vllm]==0.9.1",
               "miles": "Miles (radixark/miles' image: its checkout at /root/miles)"}
SECRETISH = re.compile(r"(TOKEN|PASSWORD|SECRET|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.IGNORECASE)
def trial_labels(trial: TrialSpec, attempt: int, name: str) -> dict[str, str]:
    """Labels on the RayJob and all its pods: select by grid, trial, pool or attempt."""
    return {
        **MANAGED_BY,
        f"{LABEL_PREFIX}/grid": names.label_safe(trial.grid),
        f"{LABEL_PREFIX}/trial": names.check_label_value(trial.trial_id, "trial id"),
        f"{LABEL_PREFIX}/pool": names.check_label_value(trial.pool, "pool name"),
        f"{LABEL_PREFIX}/attempt": str(attempt),
        f"{LABEL_PREFIX}/rayjob": name,
    }


def trainer_job(config: TrialConfig) -> TrainerJob:
    """The job of the trainer that runs ``config``'s pool under ``backend: k8s`` (verl's)."""
    job = backend("k8s").trainer(config.pool).job(config)
    if job is None:
        raise UserError(f"pool {config.pool.name}: its trainer runs no job a RayJob can hold; "
                        "fix: name a gpu pool")
    return job


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in env.items():
        names.check_env_name(k)
        if SECRETISH.search(k):
            # A secret must never travel as a literal value in a manifest (or an MLflow param).
            raise UserError(
                f"environment variable {k} looks like a secret; fix: pass it with "
                "ClusterSettings.secret_env (a secretKeyRef), not as a value"
            )
        if v is not None and str(v) != "":
            out[k] = str(v)
    return out


def _security(settings: ClusterSettings, pool: PoolSpec | None) -> tuple[Any, Any]:
    from kubernetes import client as k

    uid = settings.run_as_user
    pod = k.V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=uid,
        run_as_group=uid,
        fs_group=uid,
        seccomp_profile=k.V1SeccompProfile(type="RuntimeDefault"),
    )
    ctr = k.V1SecurityContext(
        allow_privilege_escalation=False,
        privileged=False,
        run_as_non_root=True,
        capabilities=k.V1Capabilities(drop=["ALL"]),
    )
    return pod, ctr


def _env(settings: ClusterSettings, plain: Mapping[str, str]) -> list[Any]:
    from kubernetes import client as k

    env = [k.V1EnvVar(name=n, value=v) for n, v in sorted(plain.items())]
    for s in settings.secret_env:
        ref = k.V1SecretKeySelector(name=s.secret, key=s.key, optional=s.optional)
        env.append(k.V1EnvVar(name=s.env, value_from=k.V1EnvVarSource(secret_key_ref=ref)))
    return env


def pod_template(
    *,
    role: str,
    labels: Mapping[str, str],
    image: str,
    env: list[Any],
    requests: Mapping[str, str],
    limits: Mapping[str, str],
    shm: str,
    settings: ClusterSettings,
    pool: PoolSpec | None,
    placement: Mapping[str, Any] | None = None,
    with_volumes: bool = True,
) -> Any:
    from kubernetes import client as k

    pod_sc, ctr_sc = _security(settings, pool)
    mounts, volumes = [], []
    if with_volumes:
        mounts = [
            k.V1VolumeMount(name="checkpoints", mount_path=settings.checkpoint_root),
            k.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ]
        volumes = [
            k.V1Volume(
                name="checkpoints",
                persistent_volume_claim=k.V1PersistentVolumeClaimVolumeSource(
                    claim_name=settings.checkpoint_claim
                ),
            ),
            # Ray's object store and NCCL use /dev/shm; the container default (64Mi) is too small.
            k.V1Volume(
                name="dshm", empty_dir=k.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm)
            ),
        ]
    container = k.V1Container(
        name=f"ray-{role}" if role != "submitter" else "ray-job-submitter",
        image=image,
        image_pull_policy="IfNotPresent",
        env=env or None,
        resources=k.V1ResourceRequirements(requests=dict(requests), limits=dict(limits)),
        security_context=ctr_sc,
        volume_mounts=mounts or None,
    )
    spec = k.V1PodSpec(
        containers=[container],
        volumes=volumes or None,
        security_context=pod_sc,
        service_account_name=settings.trial_service_account,
        automount_service_account_token=False,  # trial pods never talk to the API server
        enable_service_links=False,
        restart_policy="Never" if role == "submitter" else None,
        **(placement or {}),
    )
    meta = k.V1ObjectMeta(labels={**labels, f"{LABEL_PREFIX}/role": role})
    return k.ApiClient().sanitize_for_serialization(k.V1PodTemplateSpec(metadata=meta, spec=spec))


def submitter_template(labels: dict[str, str], image: str, settings: ClusterSettings) -> dict[str, Any]:
    """KubeRay's submitter pod (it only runs ``ray job submit``): small, no volumes, no GPU."""
    res = {"cpu": settings.submitter_cpu, "memory": settings.submitter_memory}
    return pod_template(role="submitter", labels=labels, image=image, env=[], requests=res,
                        limits=res, shm="", settings=settings, pool=None, with_volumes=False)


def _placement(pool: PoolSpec, fallback: Sequence[PoolSpec]) -> dict[str, Any]:
    """nodeSelector on the pool's labels (pinned), or a node affinity OR-ing same-shape pools."""
    from kubernetes import client as k

    pools = [pool, *fallback]
    tolerations, seen = [], set()
    for p in pools:
        for t in p.tolerations:
            key = (t.key, t.operator, t.value, t.effect)
            if key not in seen:
                seen.add(key)
                tolerations.append(
                    k.V1Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
                )
    out: dict[str, Any] = {"tolerations": tolerations or None}
    if not fallback:
        out["node_selector"] = dict(pool.node_labels)
        return out
    terms = [
        k.V1NodeSelectorTerm(
            match_expressions=[
                k.V1NodeSelectorRequirement(key=key, operator="In", values=[val])
                for key, val in sorted(p.node_labels.items())
            ]
        )
        for p in pools
    ]
    out["affinity"] = k.V1Affinity(
        node_affinity=k.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k.V1NodeSelector(
                node_selector_terms=terms
            )
        )
    )
    return out


def check_pool(pool: PoolSpec) -> PoolSpec:
    """``pool``, after checking it can host a trial on Kubernetes (one-line errors)."""
    where = f"pools.{pool.name}"
    if pool.kind != "gpu":
        raise UserError(
            f"{where}: pool {pool.name!r} is a {pool.kind} pool; the k8s backend "
            "runs on gpu pools; fix: use a gpu pool (h100, h20, a100, l20, ...)"
        )
    if not pool.node_labels:
        raise UserError(
            f"{where}.node_labels: empty; fix: give the node labels of the pool, "
            "e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}"
        )
    names.check_labels(dict(pool.node_labels), f"{where}.node_labels")
    if pool.gpus_per_node < 1 or pool.cpus_per_node < 1 or not pool.memory_per_node:
        raise UserError(
            f"{where}: gpus_per_node, cpus_per_node and memory_per_node must be "
            "set for a cluster pool; fix: add them to the pool catalogue"
        )
    # The quantity the worker pods request, read as the render reads it (not only by the dry run).
    parse_memory(pool.memory_per_node, f"{where}.memory_per_node")
    if pool.kueue_flavor:
        names.check_subdomain(pool.kueue_flavor, f"{where}.kueue_flavor")
    return pool


def pool_image(pool: PoolSpec, settings: ClusterSettings, engine: str = "sglang") -> str:
    """The image trial pods of ``pool`` run for a trial on rollout ``engine``: the pool's
    ``images[engine]``, else its ``image``, else ``ABLATE_K8S_IMAGE``."""
    where = f"pools.{pool.name}"
    image = pool.images.get(engine) or pool.image or settings.image  # type: ignore[call-overload]
    if not image:
        raise UserError(
            f"{where}.images.{engine}: not set; fix: set images: {{{engine}: <an image with "
            f"{IMAGE_HOLDS.get(engine, engine)} and Ray>}} (or image:) in the pool catalogue, or "
            "export ABLATE_K8S_IMAGE"
        )
    if any(c.isspace() for c in image):
        raise UserError(
            f"{where}.image {image!r} contains whitespace; fix: give an image reference"
        )
    return image


def _check_fallback(pool: PoolSpec, fallback: Sequence[PoolSpec], resume: bool) -> None:
    if not fallback:
        return
    if not resume:
        raise UserError(
            "fallback pools are only allowed for an explicit `ablate resume --pool` "
            "attempt; fix: ablation trials stay on their pool, drop fallback_pools"
        )
    for p in fallback:
        if (p.gpus_per_node, p.nodes) != (pool.gpus_per_node, pool.nodes):
            raise UserError(
                f"fallback pool {p.name!r} has {p.nodes}x{p.gpus_per_node} GPUs but {pool.name!r} "
                f"has {pool.nodes}x{pool.gpus_per_node}; fix: verl checkpoints are sharded by "
                "world size, fall back only to pools of the same shape"
            )


def render_rayjob(
    trial: TrialSpec,
    config: TrialConfig,
    pool: PoolSpec,
    *,
    settings: ClusterSettings,
    attempt: int = 1,
    run_id: str | None = None,
    resume_path: str | None = None,
    resume: bool = False,
    fallback_pools: Sequence[PoolSpec] = (),
    job: TrainerJob | None = None,
    save_freq: int | None = None,
) -> dict[str, Any]:
    """The RayJob (a plain dict, ready to send) that runs one attempt of ``trial`` on ``pool``.

    ``resume``/``fallback_pools``: set only for an explicit ``ablate resume --pool`` attempt;
    then the workers may land on any listed pool of the same shape. ``job`` gives the argv, the
    environment, the engine and the size (default: the trainer's, ``trainer_job``), saving a
    checkpoint every ``save_freq`` steps.
    """
    if trial.pool != pool.name:
        raise UserError(
            f"trial {trial.trial_id} is pinned to pool {trial.pool!r}, not "
            f"{pool.name!r}; fix: render it with its own pool"
        )
    job = job if job is not None else trainer_job(config)
    image = pool_image(check_pool(pool), settings, str(job.engine))
    for p in fallback_pools:
        check_pool(p)
    _check_fallback(pool, fallback_pools, resume or resume_path is not None)
    name = names.rayjob_name(trial.grid, trial.trial_id, attempt)
    labels = trial_labels(trial, attempt, name)
    ckpt = settings.checkpoint_dir(trial.grid, trial.trial_id)
    argv = list(job.command(trial, checkpoint_dir=ckpt, resume_path=resume_path,
                            save_freq=save_freq))
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError(f"the verl backend returned a bad argv for {trial.trial_id}: {argv!r}")
    env_list = _job_env(trial, job, settings, attempt, run_id, ckpt)
    worker = _worker_group(pool, job.world_size, settings, labels, image, env_list,
                           fallback_pools)
    annotations = _annotations(trial, fallback_pools)
    spec = _rayjob_spec(argv, labels, image, env_list, worker, settings, pool)
    return {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**labels, QUEUE_LABEL: settings.local_queue},
            "annotations": annotations,
        },
        "spec": spec,
    }


def _job_env(trial: TrialSpec, job: TrainerJob, settings: ClusterSettings, attempt: int,
             run_id: str | None, ckpt: str) -> list[Any]:
    """The pods' environment: the verl job's own (checked: no literal secrets), with verl's
    file logger writing where the orchestrator tails it."""
    env = _check_env(
        job.environment(
            trial,
            tracking_uri=settings.tracking_uri,
            run_id=run_id or "",
            file_logger_path=settings.metrics_path(trial.grid, trial.trial_id, attempt),
        )
    )
    if env.pop("VERL_FILE_LOGGER_PATH", None) is not None:
        # With an explicit path verl opens the file without creating its directory, which does
        # not exist yet on a fresh volume; with a root it creates <root>/<grid>/ itself and
        # writes <trial_id>.jsonl there (== settings.metrics_path).
        env["VERL_FILE_LOGGER_ROOT"] = settings.metrics_root(trial.grid, trial.trial_id, attempt)
    env.setdefault("ABLATE_CHECKPOINT_DIR", ckpt)
    return _env(settings, env)


def _worker_group(pool: PoolSpec, world_size: int, settings: ClusterSettings,
                  labels: Mapping[str, str], image: str, env_list: list[Any],
                  fallback_pools: Sequence[PoolSpec]) -> dict[str, Any]:
    """The GPU worker group: the recipe's ``trainer.nnodes`` pods of the pool, each its
    ``worker_fraction`` of a node, pinned to the pool (or, on a resume, its fallbacks)."""
    nodes = world_size // pool.gpus_per_node  # verl: the recipe's trainer.nnodes
    frac = settings.worker_fraction
    cpu = str(max(1, math.floor(pool.cpus_per_node * frac)))
    node_mem = parse_memory(pool.memory_per_node or "", f"pools.{pool.name}.memory_per_node")
    mem = f"{int(node_mem * frac) // 2**20}Mi"
    gpu = str(pool.gpus_per_node)
    worker_res = {"cpu": cpu, "memory": mem}
    if settings.gpu_resource:
        worker_res[settings.gpu_resource] = gpu
    worker = {
        "groupName": names.check_dns_label(f"gpu-{names.slug(pool.name, 50)}", "worker group"),
        "replicas": nodes,
        "minReplicas": nodes,
        "maxReplicas": nodes,
        "rayStartParams": {},
        "template": pod_template(
            role="worker",
            labels=labels,
            image=image,
            env=env_list,
            requests=worker_res,
            limits=worker_res,
            shm=settings.shm_size,
            settings=settings,
            pool=pool,
            placement=_placement(pool, fallback_pools),
        ),
    }
    if pool.ray_accelerator_type and not fallback_pools:
        # Ray node label (KubeRay >= 1.5 `labels`), so Ray-level selectors see the pool too.
        worker["labels"] = {
            "ray.io/accelerator-type": names.check_label_value(
                pool.ray_accelerator_type, f"pools.{pool.name}.ray_accelerator_type"
            )
        }
    return worker


def _annotations(trial: TrialSpec, fallback_pools: Sequence[PoolSpec]) -> dict[str, str]:
    annotations = {
        f"{LABEL_PREFIX}/axes": json.dumps(dict(trial.axes), sort_keys=True),
        f"{LABEL_PREFIX}/seed": str(trial.seed),
    }
    if fallback_pools:
        annotations[f"{LABEL_PREFIX}/fallback-pools"] = ",".join(p.name for p in fallback_pools)
    if trial.derived_from:
        annotations[f"{LABEL_PREFIX}/derived-from"] = (
            f"{trial.derived_from[0]}@{trial.derived_from[1]}"
        )
    return annotations


def _rayjob_spec(argv: list[str], labels: Mapping[str, str], image: str,
                 env_list: list[Any], worker: dict[str, Any],
                 settings: ClusterSettings, pool: PoolSpec) -> dict[str, Any]:
    """The RayJob's spec: the entrypoint, Kueue-friendly job settings, the head and workers."""
    head_res = {"cpu": settings.head_cpu, "memory": settings.head_memory}
    spec: dict[str, Any] = {
        "entrypoint": shlex.join(argv),
        "submissionMode": "K8sJobMode",
        # Kueue requires it, and it frees the GPUs as soon as verl exits.
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        # Retries are the orchestrator's: an infra failure resumes from the last checkpoint.
        "backoffLimit": 0,
        "submitterPodTemplate": submitter_template(labels, image, settings),
        "rayClusterSpec": {
            "enableInTreeAutoscaling": False,  # Kueue admits fixed-size clusters only
            "headGroupSpec": {
                "rayStartParams": {"num-gpus": "0"},
                "template": pod_template(
                    role="head",
                    labels=labels,
                    image=image,
                    env=env_list,
                    requests=head_res,
                    limits=head_res,
                    shm="2Gi",
                    settings=settings,
                    pool=pool,
                ),
            },
            "workerGroupSpecs": [worker],
        },
    }
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    return spec
