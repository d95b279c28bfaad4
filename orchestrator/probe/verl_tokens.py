"""In a verl probe job: the token-level figures of each step's mismatch, which verl's metrics
(batch means) do not carry: |log mu - log pi| max and quantiles, the share of tokens whose two
log-probs are bitwise equal, the token count and the per-probability buckets.

verl 0.9.1 imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` in every process that
imports verl (``verl/__init__.py``); the verl probe job (``probe/verl_job.py``) names this one
and sets ``ABLATE_PROBE_TOKENS``. Here it wraps, through the engine hook's import hook
(``verl/engine_hook.py``), ``verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics``:
the trainer's driver calls it once per step in decoupled mode with the trainer's recomputed
log-probs (``old_log_prob``), the rollout engine's (``rollout_log_prob``) and the response
mask (``rollout_corr_helper.py:904``, from ``compute_rollout_correction_and_rejection_mask``,
which ``compute_rollout_correction_and_add_to_batch`` calls, ``ray_trainer.py:1650-1660``). Each
call appends one JSON line of the simulator probe's own formulas (``sim.probe.batch_stats``) on
those tensors, so both trainers' probes report one definition. A failure to compute them is
printed and never breaks the job; the probe then finds a step without its line and says so.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from orchestrator import metrics as M
from orchestrator.verl import engine_hook

LOG_ENV = "ABLATE_PROBE_TOKENS"
MODULE = "verl.trainer.ppo.rollout_corr_helper"
# The figures taken from each call: the token-level ones and the buckets (verl's own k3, k1 and
# chi-square stay the figures read from its metrics).
KEYS = ("abs_diff_max", "abs_diff_p50", "abs_diff_p90", "abs_diff_p99", "bitwise_share",
        "tokens", *sorted(M.bucket_names()))


def token_figures(old_log_prob: Any, rollout_log_prob: Any, response_mask: Any) -> dict[str, float]:
    """The token-level figures of one step (module docstring)."""
    from orchestrator.sim.probe import batch_stats  # torch: only in the job that probes

    stats = batch_stats(old_log_prob.detach().cpu(), rollout_log_prob.detach().cpu(),
                        response_mask.detach().cpu())
    return {k: stats[k] for k in KEYS if k in stats}


def patch(module: ModuleType) -> None:
    original: Callable[..., Any] | None = getattr(module, "compute_offpolicy_metrics", None)
    if original is None or getattr(original, "_ablate", False):
        return

    def compute_offpolicy_metrics(old_log_prob: Any, rollout_log_prob: Any, response_mask: Any,
                                  *args: Any, **kwargs: Any) -> Any:
        out = original(old_log_prob, rollout_log_prob, response_mask, *args, **kwargs)
        path = os.environ.get(LOG_ENV)
        if path and rollout_log_prob is not None:
            def write() -> None:
                line = {"pid": os.getpid(), **token_figures(old_log_prob, rollout_log_prob,
                                                            response_mask)}
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line, sort_keys=True) + "\n")
            engine_hook._safe(write)
        return out

    compute_offpolicy_metrics._ablate = True  # type: ignore[attr-defined]
    module.compute_offpolicy_metrics = compute_offpolicy_metrics  # type: ignore[attr-defined]


def read(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The lines one job wrote, in step order (none if it wrote none)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if os.environ.get(LOG_ENV):
    engine_hook.PATCHES[MODULE] = patch
    engine_hook.install()
