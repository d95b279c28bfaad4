"""The k3 warning and its rescue that the rescue tests share, on every launcher
(``tests/scheduler/test_rescue_policy.py``, ``test_scheduler.py``, ``tests/slurm``).

A warning is made real at this scale (12 steps of ``sim/grpo_tiny`` with 4 x 4 samples) by an
``above`` rule with ``verdict: unstable`` on the k3 KL that sim-a100's profile (weights two
syncs stale) measures: 5e-3..1e-2 from step 2. ``min_step: 3`` puts the warning's onset at step 3;
with ``checkpoint.every: 2`` the rescue starts from step 2. The switch is ``rollout.weight_lag:
0``, what the simulator models as the source of that k3.
"""
from __future__ import annotations

K3 = "rollout_corr/k3_kl"
THRESHOLD = 0.004

SECTIONS = f"""\
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  eval.every: 100
collapse:
  rules:
    - {{name: k3_warn, metric: {K3}, kind: above, threshold: {THRESHOLD}, patience: 2,
       min_step: 3, verdict: unstable}}
  early_warning: false
early_stop: false
"""


def rescue(pool: str | None = None) -> str:
    """The ``rescue:`` section: on the warning, switch the lag off (and move to ``pool``)."""
    to = f"pool: {pool}, " if pool else ""
    return ("rescue:\n  - {when: {warning: k3_warn}, resume: {" + to
            + "set: {rollout.weight_lag: 0}}}\n")
