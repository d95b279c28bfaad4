"""Plan- and submit-time checks of a pool's ``slurm:`` block: the hardware pin (a gpu or cpu
pool needs a partition, constraint or GRES), a verl trial's node count against its pool's, and, when
the cluster answers, its partitions (``sinfo``) and the whole request (``sbatch --test-only``).
Each problem is one line naming the pool, the key and the fix."""
from __future__ import annotations

import os
import tempfile

from orchestrator.backends import TrainerJob
from orchestrator.exceptions import BackendUnavailableError, UserError
from orchestrator.pools import PoolSpec
from orchestrator.slurm import client as sc
from orchestrator.slurm.script import sbatch_options


def placement_problem(pool: PoolSpec, *, reachable_only: bool) -> str | None:
    """Why ``pool``'s ``slurm:`` block cannot place a trial: one line naming the key and the
    fix, or None. Checked against the cluster when its clients answer (``reachable_only``:
    skip the cluster when they do not, as ``ablate plan`` on a laptop)."""
    s = pool.slurm
    if pool.kind != "sim" and (s is None or (s.gres is None and s.constraint is None
                                             and s.partition is None)):
        return (f"pool {pool.name}: no slurm: placement (partition, constraint or gres): its "
                "trials could land on any node, and hardware is pinned; fix: add e.g. "
                "slurm: {partition: gpu, gres: 'gpu:h100:8'} to the pool")
    if sc.missing_clients():
        return None if reachable_only else f"pool {pool.name}: no Slurm clients here"
    # Once per pool, cluster and process: plan checks every trial.
    key = (pool.model_dump_json(), reachable_only, os.environ.get("SLURM_CONF", ""))
    if key not in _CHECKED:
        _CHECKED[key] = _ask_cluster(pool, reachable_only)
    return _CHECKED[key]


_CHECKED: dict[tuple[str, bool, str], str | None] = {}


def nodes_problem(job: TrainerJob | None, pool: PoolSpec) -> str | None:
    """A job's nodes (verl: the recipe's ``trainer.nnodes``) must be its pool's ``nodes``: the
    Slurm job asks for the pool's nodes and starts one Ray node on each. A trainer without a
    job of its own (the simulator) runs in the one job process."""
    if job is None:
        return None
    nodes = job.world_size // pool.gpus_per_node
    if nodes == pool.nodes:
        return None
    return (f"pool {pool.name}: nodes {pool.nodes}, but the trial's trainer.nnodes is {nodes}; "
            f"the Slurm job gets the pool's nodes and verl must span all of them; fix: set "
            f"trainer.nnodes: {pool.nodes} for this pool's trials (grid overrides, or a bundle "
            "axis with exclude), or use a pool whose nodes match")


def _ask_cluster(pool: PoolSpec, reachable_only: bool) -> str | None:
    client = sc.SlurmClient(timeout=10.0)
    try:
        facts = client.facts()
    except (sc.SlurmError, BackendUnavailableError) as exc:
        detail = str(exc).removeprefix("infra_failure: ")
        return None if reachable_only else (
            f"pool {pool.name}: the Slurm cluster does not answer ({detail}); fix: point "
            "SLURM_CONF at the cluster's slurm.conf and check that slurmctld is up (`sinfo`)")
    s = pool.slurm
    if s is not None and s.partition is not None and s.partition not in facts.partitions:
        return (f"pool {pool.name}: slurm.partition {s.partition!r}: the cluster has no such "
                f"partition (it has {', '.join(sorted(facts.partitions))}); fix: name one of them")
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as fh:
        fh.write("#!/bin/bash\ntrue\n")
        fh.flush()
        try:
            client.test_only(sbatch_options(pool, name="ablate-check"), fh.name, pool=pool.name)
        except UserError as exc:
            return str(exc)
    return None
