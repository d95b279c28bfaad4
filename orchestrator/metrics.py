"""Metric names shared by every backend, the verdict rules and the comparison tables.

Names follow verl 0.9.1 where verl has the metric (``research/verl-0.9.1.md`` section 2), so a
verl job logging straight into the trial's MLflow run and the simulator look the same.
"""
from __future__ import annotations

import re

_INVALID = re.compile(r"[^/\w.\- :]")
_SLASHES = re.compile(r"/+")
PARAM_KEY_MAX = 250  # MLflow's longest param key


def mlflow_key(key: str) -> str:
    """verl 0.9.1's MLflow key sanitiser (``@`` -> ``_at_``, ``//`` -> ``/``, others -> ``_``):
    the name a metric or param is stored under. Two grid names that give one key would share one
    param, so the grid refuses them at plan time (``grid/_validation``)."""
    return _INVALID.sub("_", _SLASHES.sub("/", key.replace("@", "_at_")))


def param_key(key: str) -> str:
    """The MLflow param key a trial's axis value or override is stored under."""
    return mlflow_key(key)[:PARAM_KEY_MAX]

# Reward
TRAIN_REWARD = "critic/score/mean"  # mean verifiable reward of the step's rollouts
EVAL_REWARD = "eval/reward"  # held-out eval reward (greedy-free sampling, fixed prompts)
# The same held-out eval scored by the grid's reference evaluator (``eval: {reference: ...}``),
# one evaluator for every arm (``orchestrator/evaluation.py``): the arm's own engine left out.
EVAL_REWARD_REF = "eval/reward_ref"
RESPONSE_LENGTH = "response_length/mean"

# Training health
GRAD_NORM = "actor/grad_norm"  # before clipping
ENTROPY = "actor/entropy"
PG_LOSS = "actor/pg_loss"
PG_CLIPFRAC = "actor/pg_clipfrac"
PPO_KL = "actor/ppo_kl"
KL_LOSS = "actor/kl_loss"
LR = "actor/lr"
# learner.precision fp16. verl 0.9.1 logs neither a loss scale nor a skip flag (neither
# "loss_scale" as a metric nor "skipped_update" occurs in it; tests/test_fp16.py greps): its fp16
# path (workers/engine/fsdp/transformer_impl.py:405-409, ShardedGradScaler(growth_interval=400))
# unscales, clips and lets scaler.step skip the update on overflow (:798-834), returning the
# non-finite grad norm, which is logged as actor/grad_norm. These two names are the project's own:
# the simulator logs both, the verl metric tail derives SKIPPED_SHARE from a non-finite grad norm
# on an fp16 learner. The verdict excuses a non-finite grad norm on a row whose SKIPPED_SHARE > 0
# and judges persistent skips by their own rule (verdict/_rules.py: fp16_skipped_updates).
SKIPPED_SHARE = "fp16/skipped_share"  # share of the step's optimizer updates skipped on overflow
LOSS_SCALE = "fp16/loss_scale"  # the dynamic loss scale after the step (simulator only)
OPSM_FRACTION = "actor/opsm_fraction"  # sequences masked by OPSM (DeepSeek-V3.2), Miles opsm_clipfrac

# Training-inference mismatch (pi_old recomputed by the trainer vs mu from the rollout engine)
K1_KL = "rollout_corr/kl"  # E[log mu - log pi_old]
K3_KL = "rollout_corr/k3_kl"  # E[rho - log rho - 1], rho = pi_old / mu
LOG_PPL_DIFF = "rollout_corr/log_ppl_diff"
LOG_PPL_ABS_DIFF = "rollout_corr/log_ppl_abs_diff"
TRAINING_PPL = "rollout_corr/training_ppl"
ROLLOUT_PPL = "rollout_corr/rollout_ppl"
CHI2_TOKEN = "rollout_corr/chi2_token"
CHI2_SEQ = "rollout_corr/chi2_seq"
TV = "rollout_corr/tv"  # 0.5 * E_mu|rho - 1|, token level
IS_MEAN = "rollout_corr/rollout_is_mean"
IS_STD = "rollout_corr/rollout_is_std"
IS_MIN = "rollout_corr/rollout_is_min"
IS_MAX = "rollout_corr/rollout_is_max"
IS_ESS = "rollout_corr/rollout_is_eff_sample_size"
IS_FRAC_HIGH = "rollout_corr/rollout_is_ratio_fraction_high"
IS_FRAC_LOW = "rollout_corr/rollout_is_ratio_fraction_low"
IS_BATCH_NORM = "rollout_corr/rollout_is_batch_norm_factor"
IS_MASKED_FRACTION = "rollout_corr/rollout_is_masked_fraction"  # mask mode (IcePop band)
# verl's name for IcePop's masked share (rollout_corr_helper.py:621); the verl backend also
# reports it as IS_MASKED_FRACTION (VERL_ALIASES), so rules and tables agree across backends.
IS_OOB_RATIO = "rollout_corr/rollout_is_oob_ratio"
RS_MASKED_FRACTION = "rollout_corr/rollout_rs_masked_fraction"
RS_SEQ_MASKED_FRACTION = "rollout_corr/rollout_rs_seq_masked_fraction"
VETO_FRACTION = "rollout_corr/rollout_veto_seq_fraction"
PROB_DIFF_MEAN = "training/rollout_probs_diff_mean"  # |p_rollout - p_trainer|, probability space
# verl's debug metrics (verl/utils/debug/metrics.py:76-80), verl only.
PROB_DIFF_MAX = "training/rollout_probs_diff_max"
PROB_DIFF_STD = "training/rollout_probs_diff_std"
PROB_PEARSON = "training/rollout_actor_probs_pearson_corr"

# verl's rejection-sampling options (rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS); verl logs
# each option's token and sequence masked fraction (rollout_corr_helper.py:403-404).
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rs_option_names(option: str) -> tuple[str, str]:
    """verl's (token, sequence) masked-fraction names of one rejection-sampling option."""
    return (f"rollout_corr/rollout_rs_{option}_masked_fraction",
            f"rollout_corr/rollout_rs_{option}_seq_masked_fraction")

# Mismatch bucketed by the rollout probability of the sampled token (seed 000's finding).
PROB_BUCKETS: tuple[tuple[float, float], ...] = (
    (0.0, 1e-3), (1e-3, 1e-2), (1e-2, 0.1), (0.1, 0.3), (0.3, 0.5),
    (0.5, 0.7), (0.7, 0.9), (0.9, 0.99), (0.99, 1.0 + 1e-9),
)  # fmt: skip


def bucket_name(lo: float, hi: float, stat: str = "k3_kl") -> str:
    """``mismatch/k3_kl/p_0.1-0.3``: mismatch of tokens whose rollout probability is in [lo, hi)."""
    return f"mismatch/{stat}/p_{lo:g}-{min(hi, 1.0):g}"


def bucket_count_name(lo: float, hi: float) -> str:
    return bucket_name(lo, hi, "token_fraction")


# Throughput
TIME_PER_STEP = "perf/time_per_step"
TIME_GEN = "timing_s/gen"
TIME_UPDATE = "timing_s/update_actor"
TIME_EVAL_REF = "timing_s/eval_ref"  # the reference evaluation of the step (the project's own)


# --------------------------------------------------------------------------- verl's names
# (which names each trainer reports is the trainer's to say: ``backends.base.Trainer.reported``)

# Namespaces of the metrics verl's file logger writes; the verl backend passes every one of them
# through (``verl/files.normalise``), plus the shared names above.
VERL_NAMESPACES = (
    "actor/", "critic/", "rollout_corr/", "training/", "response_length/", "prompt_length/",
    "response/", "global_seqlen/", "timing_s/", "timing_per_token_ms/", "perf/", "val-core/",
    "val-aux/", "num_turns/", "tool_call_counts/", "health/", "eval/",
)


# verl's name -> the shared name the verl backend also reports it under (``verl/files.normalise``).
VERL_ALIASES = {IS_OOB_RATIO: IS_MASKED_FRACTION}


def bucket_names() -> frozenset[str]:
    """Every per-probability-bucket name (mismatch and count) of ``PROB_BUCKETS``."""
    return frozenset(n for lo, hi in PROB_BUCKETS
                     for n in (bucket_name(lo, hi), bucket_count_name(lo, hi)))


def vocabulary() -> frozenset[str]:
    """Every metric name defined here: per-bucket mismatch and per-option RS names included."""
    names = {v for k, v in globals().items() if k.isupper() and isinstance(v, str)}
    names |= {n for opt in RS_OPTIONS for n in rs_option_names(opt)}
    return frozenset(names | bucket_names())


# Our name -> (Miles' name, slime's name) for the same quantity, for users comparing runs of
# those frameworks (research/engines-and-axes.md 2b; "" where the framework has none). Miles
# logs k3 twice: train_rollout_kl (always, per-token clamp +-10) and mis_k3_kl (its mis.py).
PEER_NAMES: dict[str, tuple[str, str]] = {
    K3_KL: ("train/train_rollout_kl, train/mis_k3_kl", "train/mis_k3_kl"),
    K1_KL: ("train/mis_kl", "train/mis_kl"),
    TRAINING_PPL: ("train/mis_training_ppl", "train/mis_training_ppl"),
    ROLLOUT_PPL: ("train/mis_rollout_ppl", "train/mis_rollout_ppl"),
    LOG_PPL_DIFF: ("train/mis_log_ppl_diff", "train/mis_log_ppl_diff"),
    LOG_PPL_ABS_DIFF: ("train/mis_log_ppl_abs_diff", "train/mis_log_ppl_abs_diff"),
    CHI2_TOKEN: ("train/mis_chi2_token", "train/mis_chi2_token"),
    CHI2_SEQ: ("train/mis_chi2_seq", "train/mis_chi2_seq"),
    IS_BATCH_NORM: ("train/mis_batch_norm_factor", "train/mis_batch_norm_factor"),
    OPSM_FRACTION: ("train/opsm_clipfrac", "train/opsm_clipfrac"),
    # Miles / slime: mean |log pi_train - log mu| (log space); ours and verl's: |p - p'|.
    PROB_DIFF_MEAN: ("train/train_rollout_logprob_abs_diff (log space)",
                     "train/train_rollout_logprob_abs_diff (log space)"),
}


# What a probe (``ablate probe``) reports per configuration, each from one per-batch value: its
# table's columns and the names a gate (``--gate``, a grid's ``preflight.gate``) takes; the
# trials' names of the same quantities are accepted too.
PROBE_METRICS: dict[str, str] = {
    "k3": K3_KL, "k1": K1_KL, "chi2": CHI2_TOKEN, "abs_diff_max": "abs_diff_max",
    "abs_diff_p50": "abs_diff_p50", "abs_diff_p90": "abs_diff_p90",
    "abs_diff_p99": "abs_diff_p99", "bitwise_share": "bitwise_share", "tokens": "tokens",
    "wall_s": "wall_s",
}
