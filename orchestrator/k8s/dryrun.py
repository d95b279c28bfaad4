"""``ablate submit GRID --backend k8s --dry-run``: every manifest of every trial, for inspection,
plus the RayJob that runs ``ablate submit`` on the control RayCluster of ``k8s/base``.
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator import backends
from orchestrator.grid import expand, load_grid
from orchestrator.k8s import names
from orchestrator.k8s.queues import dump, render_kueue
from orchestrator.k8s.render import RAYJOB_API, render_rayjob, submitter_template
from orchestrator.k8s.settings import LABEL_PREFIX, MANAGED_BY, ClusterSettings
from orchestrator.store import workspace

CONTROL_CLUSTER = "ablate-control"
WORKSPACE = "/ablate/workspace"


def render_control_rayjob(
    grid_name: str, grid_file: str, settings: ClusterSettings
) -> dict[str, Any]:
    """The RayJob that runs ``ablate submit`` on the long-lived control RayCluster (k8s/base).

    It targets that cluster with ``clusterSelector`` (so Kueue does not queue the control plane
    itself); the grid file is read from the workspace volume of the control head.
    """
    base = grid_file.rsplit("/", 1)[-1]
    argv = [
        "ablate",
        "submit",
        f"{WORKSPACE}/grids/{base}",
        "--backend",
        "k8s",
        "--workdir",
        f"{settings.checkpoint_root}/.ablate",
        "--tracking-uri",
        settings.tracking_uri,
        "--no-progress",
    ]
    g = names.slug(grid_name, 30) or "grid"
    name = names.check_dns_label(
        f"ablate-submit-{g}", "control RayJob name", max_len=names.MAX_RAYJOB_NAME, dns1035=True
    )
    labels = {
        **MANAGED_BY,
        f"{LABEL_PREFIX}/grid": names.label_safe(grid_name),
        f"{LABEL_PREFIX}/role": "control",
    }
    submitter = submitter_template(labels, settings.control_image, settings)
    return {
        "apiVersion": RAYJOB_API,
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "entrypoint": shlex.join(argv),
            "submissionMode": "K8sJobMode",
            "clusterSelector": {"ray.io/cluster": CONTROL_CLUSTER},
            "submitterPodTemplate": submitter,
        },
    }


def dry_run(grid_path: str, out_dir: str | None = None, force: bool = False,
            backend: str = "k8s") -> int:
    """Write every manifest of every trial of ``grid_path`` (and its Kueue objects) to a directory.

    Nothing is sent to a cluster. Layout: ``<out>/rayjobs/<rayjob>.yaml`` (one per trial, first
    attempt), ``<out>/kueue.yaml``, ``<out>/control-rayjob.yaml``, ``<out>/index.json``.
    """
    import kubernetes  # noqa: F401 - the renderer's; missing, it is refused before a file is written

    settings = ClusterSettings.from_env()
    grid = load_grid(grid_path, backend=backend, limit_trials=not force)
    runs = backends.backend(backend)
    trials = expand(grid, force=force)
    out, jobs_dir = workspace.dry_run_dir(out_dir, default=f"k8s-dry-run/{grid.name}",
                                          files="rayjobs", pattern="ab-*.yaml")
    index = []
    for trial in trials:
        pool, config = grid.pools.pools[trial.pool], grid.trial_config(trial)
        manifest = render_rayjob(trial, config, pool, settings=settings,
                                 job=runs.trainer(pool).job(config))
        name = manifest["metadata"]["name"]
        (jobs_dir / f"{name}.yaml").write_text(dump([manifest]), encoding="utf-8")
        index.append(
            {
                "trial_id": trial.trial_id,
                "pool": trial.pool,
                "rayjob": name,
                "file": f"rayjobs/{name}.yaml",
                "axes": dict(trial.axes),
                "seed": trial.seed,
            }
        )
    pools = sorted({t.pool for t in trials})
    # A rescue runs on its entry's pool: its queue must exist before the grid starts.
    rescue_pools = sorted({e.resume.pool for e in grid.spec.rescue_policy
                           if e.resume.pool is not None} - set(pools))
    (out / "kueue.yaml").write_text(
        dump(render_kueue(grid.pools, settings, pools + rescue_pools)), encoding="utf-8"
    )
    (out / "control-rayjob.yaml").write_text(
        dump([render_control_rayjob(grid.name, str(grid_path), settings)]), encoding="utf-8"
    )
    workspace.write_dry_run_index(out, grid.name, index, namespace=settings.namespace)
    print(
        f"wrote {len(index)} RayJob manifest(s) for grid {grid.name!r} on pool(s) "
        f"{', '.join(pools)} to {out}"
        + (f" (Kueue objects also for rescue pool(s) {', '.join(rescue_pools)})"
           if rescue_pools else "")
    )
    return 0
