"""The collapse rules a grid runs by: the defaults (drawn from the seeds) and how a grid's
``collapse:`` section adds to or replaces them.

Apart from the detectors (``_detectors``) because this is vocabulary a reader looks up (the
docs list ``DEFAULT_RULES``), while the detectors are the machinery that follows one rule.
"""
from __future__ import annotations

from orchestrator import metrics as M
from orchestrator.schema import CollapseRuleSpec, CollapseSpec

DEFAULT_RULES: tuple[CollapseRuleSpec, ...] = (
    # Seed 002: "the gradient norms suddenly explode, leading to model collapse".
    # min_delta: the norm must also rise >= 1.0 above the median (verl clips at 1.0): after an
    # entropy collapse the median sits near 0 and an ordinary gradient is "10x" of it.
    CollapseRuleSpec(name="grad_norm_explosion", metric=M.GRAD_NORM, kind="explode",
                     threshold=10.0, window=20, patience=3, min_step=5, min_delta=1.0),
    # Reward collapse: the smoothed reward loses half of its peak, and at least min_delta (an
    # absolute floor so noise around a near-zero reward is not a collapse).
    CollapseRuleSpec(name="eval_reward_drop", metric=M.EVAL_REWARD, kind="drop_from_peak",
                     threshold=0.5, window=2, patience=2, min_step=0, min_delta=0.03),
    CollapseRuleSpec(name="train_reward_drop", metric=M.TRAIN_REWARD, kind="drop_from_peak",
                     threshold=0.5, window=10, patience=5, min_step=0, min_delta=0.03),
    # Seed 000: the training policy's PPL blows up together with vllm-kl. PPL >= 1, so its best
    # cannot sit near 0 and 3x of it is at least 3.0: no floor needed. (No default entropy
    # blow-up: in the simulator entropy falls to ~0 and recovers; a grid that adds one needs a
    # min_delta, or a 0.001 -> 0.01 nats flicker reads as a 10x "blow-up".)
    CollapseRuleSpec(name="ppl_blowup", metric=M.TRAINING_PPL, kind="blowup",
                     threshold=3.0, window=5, patience=5, min_step=5),
    # Seed 000: A100 k3 in 1e-2..1 made training infeasible; corrections.md: |kl| > 0.1 warns.
    CollapseRuleSpec(name="k3_kl_high", metric=M.K3_KL, kind="above",
                     threshold=0.1, window=1, patience=20, verdict="unstable"),
    # No default rule on a vanished gradient: a policy whose samples all score alike has grad
    # norm exactly 0 whether it converged at a good reward or died at a bad one (a findings probe
    # judged converged sim-h20 runs at eval reward 0.5-0.75 "collapsed" by such a rule). A grid
    # that wants it adds e.g. {name: no_gradient, metric: actor/grad_norm, kind: below,
    # threshold: 1.0e-8, patience: 10} to collapse.extra_rules; the reward rules above judge
    # a dead policy by its reward.
    CollapseRuleSpec(name="nonfinite", metric="*", kind="nonfinite"),
    # fp16 learners (learner.precision: fp16): an overflow skips the update and halves the loss
    # scale (torch's GradScaler, verl 0.9.1 transformer_impl.py:409 growth_interval=400). That is
    # routine at the start and after each growth, and the nonfinite rule excuses the grad norm of
    # such a step (_detectors.SKIP_EXCUSED). Most of the updates of 10 steps in a row (patience)
    # skipped means the scale has fallen by 2^10 or more and the gradients still
    # overflow: the learner no longer trains.
    CollapseRuleSpec(name="fp16_skipped_updates", metric=M.SKIPPED_SHARE, kind="above",
                     threshold=0.5, window=1, patience=10),
)


def resolve_rules(spec: CollapseSpec) -> tuple[CollapseRuleSpec, ...]:
    """The grid's rules: defaults (or its own list, or none) plus ``extra_rules``; later names win."""
    base: tuple[CollapseRuleSpec, ...]
    if spec.rules == "default":
        base = DEFAULT_RULES
    elif spec.rules == "none":
        base = ()
    else:
        base = tuple(spec.rules)
    merged = {r.name: r for r in (*base, *spec.extra_rules)}
    return tuple(merged.values())
