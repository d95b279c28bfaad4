"""A probe's MLflow run, in the grid's experiment beside its trials' (``tracking``): tagged
``ablate.role: probe`` and by the probe's content hash, so a second probe of the same
configurations finds its run instead of adding one. Small on purpose: per configuration the
headline figures with their interval bounds, the files as artifacts.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from orchestrator.metrics import mlflow_key
from orchestrator.probe._plan import Plan, digest
from orchestrator.probe._summary import Summary
from orchestrator.store import workspace
from orchestrator.tracking import ROLE_TAG, client, experiment_for

ROLE = "probe"
PROBE_TAG = "ablate.probe_id"
HEADLINE = ("k3", "k1", "abs_diff_max", "bitwise_share", "chi2")


def log_probe(plan: Plan, summaries: Sequence[Summary], files: Sequence[Path], *,
              tracking_uri: str | None, workdir: str | None) -> str:
    """The id of the probe's run (made now, or found from an earlier identical probe)."""
    uri = workspace.tracking_uri(tracking_uri, workdir)
    mlc = client(uri)
    exp = experiment_for(mlc, plan.grid.name, uri, workspace.workdir(workdir))
    pid = digest({"probes": sorted(s.measured.config.probe_id for s in summaries),
                  "knobs": sorted(k for s in summaries for k in s.measured.knobs)})
    found = mlc.search_runs([exp], filter_string=f"tags.`{PROBE_TAG}` = '{pid}'", max_results=1)
    if found:
        return str(found[0].info.run_id)
    run = mlc.create_run(exp, run_name=f"probe-{pid}", tags={ROLE_TAG: ROLE, PROBE_TAG: pid})
    rid = str(run.info.run_id)
    mlc.log_param(rid, "probe.seeds", " ".join(map(str, plan.seeds)))
    mlc.log_param(rid, "probe.batches", str(plan.batches))
    for s in summaries:
        base = mlflow_key(f"probe/{s.measured.config.pool.name}/{s.measured.config.probe_id}")
        for name in HEADLINE:
            i = s.metrics[name]
            for suffix, v in (("", i.estimate), ("_lo", i.low), ("_hi", i.high)):
                if not math.isnan(v):  # NaN bounds (one batch) are left out
                    mlc.log_metric(rid, f"{base}/{name}{suffix}", v)
        for a in s.attribution:
            mlc.log_metric(rid, mlflow_key(f"{base}/attribution/{a.knob}"), a.delta.estimate)
    for path in files:
        mlc.log_artifact(rid, str(path))
    mlc.set_terminated(rid)
    return rid
