"""A real local Ray cluster with several raylets, for the scheduler and reliability tests.

``pool_cluster(nodes)`` starts a head without CPUs plus one raylet per entry of ``nodes``
(``(pool, capacity)``: the node advertises ``pool:<pool>`` x capacity and the label
``pool=<pool>``), with Ray's temp dir short (its socket paths have a length cap) and
``extra_paths`` on PYTHONPATH so Ray workers import the tests' doubles. Yields
``(cluster, [node, ...])`` and restores the environment afterwards. ``write_grid`` writes a sim
grid for it; ``submit_while`` submits one while a watcher thread acts on it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator.store.workspace import scoped_environ

# A tiny simulator config: ~0.15 s per step on a 2-core machine.
TINY = """\
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  train.minibatches: 1
  eval.every: 5
  eval.prompts: 16
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
"""


@contextlib.contextmanager
def pool_cluster(nodes: Sequence[tuple[str, int]], *, extra_paths: Sequence[Path] = (),
                 env: dict[str, str] | None = None) -> Iterator[tuple[Any, list[Any]]]:
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    path = os.pathsep.join(filter(None, [*map(str, extra_paths), os.environ.get("PYTHONPATH")]))
    try:
        with scoped_environ({"RAY_TMPDIR": tmp, "PYTHONPATH": path, **(env or {})}):
            c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
            try:
                started = [c.add_node(num_cpus=cap, resources={f"pool:{pool}": cap},
                                      labels={"pool": pool}) for pool, cap in nodes]
                c.wait_for_nodes()
                yield c, started
            finally:
                c.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def submit_while(path: Path, address: str, watcher: Callable[[], object]) -> dict[str, Any]:
    """Submit the grid at ``path`` to the cluster at ``address`` while ``watcher`` runs in a
    daemon thread (it acts on the running grid: kills a worker, cancels, removes a node); the
    submission's summary, once the watcher had up to 5 s more to end."""
    from orchestrator import scheduler

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    summary = scheduler.submit(str(path), address=address, progress=False)
    th.join(5)
    return summary


def write_grid(path: Path, name: str, *, steps: int, pools: list[str], seeds: list[int],
               levels: list[str], budget: str | None = "{max_parallel: 2}", extra: str = "",
               axes: str = "", retries: int | None = 2, every: int | None = 5,
               keep: int | None = 2, tiny: bool = True) -> Path:
    """A sim grid over IS levels x pools (``axes``: more axis lines; ``extra``: more sections).
    ``budget``, ``retries``, ``every`` (the checkpoint line) or ``keep`` None leaves it out:
    the schema's default holds."""
    ckpt = ("" if every is None else f"checkpoint: {{every: {every}}}\n" if keep is None
            else f"checkpoint: {{every: {every}, keep: {keep}}}\n")
    retry = "" if retries is None else f"retries: {{max: {retries}}}\n"
    cap = "" if budget is None else f"budget: {budget}\n"
    path.write_text(f"""\
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: {steps}
seeds: {seeds}
axes:
  correction.is_level: {levels}
  pool: {pools}
{axes}{ckpt}{retry}{cap}{TINY if tiny else ""}{extra}""")
    return path
