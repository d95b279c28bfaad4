"""Reading what a grid run left behind, for tests: each trial's records on disk and a metric's
steps in MLflow (shared by the scheduler, runner and reliability tests)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.store import TrialPaths, records


def trials(grid_dir: Path) -> dict[str, dict[str, Any]]:
    """Every trial of a grid directory: spec, state record, attempts and metric steps on disk."""
    out = {}
    for spec in sorted((Path(grid_dir) / "trials").glob("*/spec.json")):
        paths = TrialPaths(grid_dir, spec.parent.name)
        s = json.loads(spec.read_text())
        out[s["trial_id"]] = {
            "spec": s,
            "paths": paths,
            "state": records.load_state(paths, s["trial_id"]),
            "attempts": records.load_attempts(paths),
            "steps": [st for st, _ in records.iter_metrics(paths.metrics)],
        }
    return out


def mlflow_steps(uri: str, run_id: str, key: str) -> list[int]:
    """The steps at which MLflow holds ``key`` for ``run_id``, sorted (a duplicate shows twice)."""
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))
