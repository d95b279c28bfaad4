"""Kueue objects derived from the pool catalogue: one ResourceFlavor per GPU pool, one
ClusterQueue with a per-flavor GPU quota, one LocalQueue in the trials' namespace.

There is one catalogue (``orchestrator/pools.yaml``); ``k8s/base/kueue.yaml`` is this module's
output for it (``python -m orchestrator.k8s.queues > k8s/base/kueue.yaml``) and a test keeps the
two identical.

Quotas: a pool of ``capacity`` concurrent trials of ``nodes`` x ``gpus_per_node`` GPUs gets
``capacity * nodes * gpus_per_node`` GPUs of its flavor. CPU and memory form a second resource
group on a label-free flavor, so CPU-only pods (Ray heads, submitters) are not pushed onto GPU
nodes. No fallback between GPU flavors: each trial's workers select their pool's node labels,
and Kueue only assigns a flavor whose ``nodeLabels`` match the pod's node selector;
``flavorFungibility`` additionally stops the search at the first flavor that could borrow or
preempt instead of moving on to another GPU type.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from orchestrator.k8s import names
from orchestrator.k8s.render import check_pool, parse_memory
from orchestrator.k8s.settings import GPU_RESOURCE, MANAGED_BY, ClusterSettings
from orchestrator.pools import PoolCatalog, PoolSpec, load_catalog

KUEUE_API = "kueue.x-k8s.io/v1beta2"
CPU_FLAVOR = "ablate-cpu"
CLUSTER_QUEUE = "ablate"


def flavor_name(pool: PoolSpec) -> str:
    return names.check_subdomain(
        pool.kueue_flavor or f"gpu-{pool.name}", f"pools.{pool.name}.kueue_flavor"
    )


def resource_flavor(pool: PoolSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": dict(pool.node_labels)}
    if pool.tolerations:
        spec["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v is not None
            }
            for t in pool.tolerations
        ]
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor_name(pool), "labels": dict(MANAGED_BY)},
        "spec": spec,
    }


def _trial_footprint(pool: PoolSpec, s: ClusterSettings) -> tuple[int, int]:
    """Millicores and MiB one trial requests (workers + head + submitter), as render.py asks."""

    def milli(q: str) -> int:
        return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)

    cpu = pool.nodes * max(1, math.floor(pool.cpus_per_node * s.worker_fraction)) * 1000
    mem = pool.nodes * int(
        parse_memory(pool.memory_per_node or "", "memory") * s.worker_fraction // 2**20
    )
    cpu += milli(s.head_cpu) + milli(s.submitter_cpu)
    mem += (
        parse_memory(s.head_memory, "head_memory") + parse_memory(s.submitter_memory, "mem")
    ) // 2**20
    return cpu, mem


def render_kueue(
    catalog: PoolCatalog, settings: ClusterSettings, pools: list[str] | None = None
) -> list[dict[str, Any]]:
    """ResourceFlavors, the ClusterQueue and the LocalQueue for the GPU pools of ``catalog``."""
    chosen = [
        catalog.pools[n] for n in (pools or catalog.names()) if catalog.pools[n].kind == "gpu"
    ]
    s = settings
    gpu_res = s.gpu_resource or GPU_RESOURCE
    flavors, gpu_flavors, cpu_total, mem_total = [], [], 0, 0
    for pool in chosen:
        check_pool(pool)
        flavors.append(resource_flavor(pool))
        gpus = pool.capacity * pool.nodes * pool.gpus_per_node
        gpu_flavors.append(
            {"name": flavor_name(pool), "resources": [{"name": gpu_res, "nominalQuota": gpus}]}
        )
        cpu, mem = _trial_footprint(pool, s)
        cpu_total += pool.capacity * cpu
        mem_total += pool.capacity * mem
    cpu_flavor = {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": CPU_FLAVOR, "labels": dict(MANAGED_BY)},
        "spec": {},
    }
    groups: list[dict[str, Any]] = [
        {
            "coveredResources": ["cpu", "memory"],
            "flavors": [
                {
                    "name": CPU_FLAVOR,
                    "resources": [
                        {"name": "cpu", "nominalQuota": f"{max(cpu_total, 1000)}m"},
                        {"name": "memory", "nominalQuota": f"{max(mem_total, 1024)}Mi"},
                    ],
                }
            ],
        }
    ]
    if gpu_flavors:
        groups.append({"coveredResources": [gpu_res], "flavors": gpu_flavors})
    cq = _cluster_queue(s, groups)
    lq = {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": s.local_queue, "namespace": s.namespace, "labels": dict(MANAGED_BY)},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }
    return [cpu_flavor, *flavors, cq, lq]


def _cluster_queue(s: ClusterSettings, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The one ClusterQueue: FIFO, no flavor fungibility and no preemption (see below)."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE, "labels": dict(MANAGED_BY)},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            # Never look past a flavor that could borrow or preempt: no silent GPU-type change.
            "flavorFungibility": {
                "whenCanBorrow": "MayStopSearch",
                "whenCanPreempt": "MayStopSearch",
            },
            # A running ablation trial is a measurement: nothing preempts it.
            "preemption": {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"},
            "resourceGroups": groups,
        },
    }


def dump(objs: list[dict[str, Any]], header: str = "") -> str:
    """Multi-document YAML, keys in insertion order (what kubectl and kustomize read)."""
    import yaml

    body = "---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objs)
    return header + body


HEADER = (
    "# Generated from orchestrator/pools.yaml by `python -m orchestrator.k8s.queues`;\n"
    "# do not edit by hand (tests/k8s checks it matches the catalogue).\n"
)


if __name__ == "__main__":
    sys.stdout.write(dump(render_kueue(load_catalog(), ClusterSettings()), HEADER))
