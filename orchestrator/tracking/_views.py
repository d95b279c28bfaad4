"""The grid's view in the MLflow UI: the runs table with the trial runs' axis values, pool,
seed and verdict as columns (MLflow's default shows no params at all). Saved when a submission
opens its parent run and again by ``ablate ui``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.tracking._store import ROLE_TAG, sanitize_key

if TYPE_CHECKING:
    from mlflow import MlflowClient

VIEW_KEY = "ablate-trials"


def save_trials_view(mlc: MlflowClient, experiment_id: str, axes: Sequence[str] | None = None) -> str:
    """A shared MLflow UI view of the experiment with the axis values, pool, seed and verdict as
    columns (stored as the experiment tag the UI reads for ``?viewStateShareKey=``); returns the key.

    Without it the runs table shows only Source/Models/Dataset and no params at all.
    """
    if axes is None:
        grids = mlc.search_runs([experiment_id], f"tags.`{ROLE_TAG}` = 'grid'", max_results=1,
                                order_by=["attributes.start_time DESC"])
        axes = [a for a in (grids[0].data.tags.get("axes", "") if grids else "").split(", ") if a]
    cols = [f"params.`{sanitize_key(a)}`" for a in axes if a != "pool"]
    cols += ["params.`pool`", "params.`seed`", "tags.`verdict`", "tags.`verdict.step`", "tags.`trial_id`",
             "metrics.`eval/reward`", "metrics.`rollout_corr/k3_kl`", "metrics.`actor/grad_norm`"]
    state = {"selectedColumns": cols, "runsHiddenMode": "SHOW_ALL", "orderByKey": "attributes.start_time",
             "orderByAsc": True}
    mlc.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}", json.dumps(state))
    return VIEW_KEY
