"""Kubernetes: render KubeRay RayJobs per trial (``render``), Kueue objects from the pool
catalogue (``queues``), name rules (``names``), submission/watching (``client``) and the
dry run (``dryrun``).

Importing this package is cheap; the kubernetes client is imported by the modules that use it.
"""

from __future__ import annotations


def dry_run(grid_path: str, out_dir: str | None = None, force: bool = False) -> int:
    """``ablate submit GRID --backend k8s --dry-run``: write every manifest, submit nothing."""
    from orchestrator.k8s.dryrun import dry_run as _dry_run

    return _dry_run(grid_path, out_dir=out_dir, force=force)
