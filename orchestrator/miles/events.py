"""Miles' metrics as it writes them: TensorBoard event files (``--use-tensorboard``; the
directory is ``$TENSORBOARD_DIR``, miles/utils/tracking_utils/tensorboard_utils.py:38-44, one
``SummaryWriter.add_scalar`` per metric), read while the run goes on with TensorBoard's own
event-file loader and turned into the project's metric vocabulary, one record per trial step.

Steps (miles-rl 0.0.2): Miles' rollout ``r`` (0-based, train.py:95) is the trial's step
``r + 1``. ``rollout/*`` are logged at ``r`` (metric_utils.compute_rollout_step, 117-120),
``train/*`` at ``r * steps_per_rollout + i`` (log_utils.py:440, ``i`` the optimizer step
within the rollout): a step's train metrics are the mean over its optimizer steps. A step is
complete once a later step has a reading (or at :meth:`TensorBoardTail.flush`). ``eval/<name>``
(the recipe's first ``eval_prompt_data`` name) is logged at the rollout it follows (train.py:136),
so it is that step's; the recipes skip the evaluation before training
(``skip_eval_before_train``), which would be logged at rollout 0 as well.

Miles' ``train_rollout_logprob_abs_diff`` is a log-space difference, not the probability-space
``training/rollout_probs_diff_mean`` of the vocabulary: it is not read as that.

The k3 mismatch is Miles' MIS function's ``mis_k3_kl`` where it runs (it compares the
trainer's recomputed log-probs with the rollout's), else Miles' own ``train_rollout_kl`` (k3 of
KL(rollout || train), each token clamped to [-10, 10], loss.py:812-829), which compares the
rollout with ``old_log_probs``: under ``--use-rollout-logprobs`` those are the rollout's own, so
it is 0 by construction and never read as the mismatch (bypass trials run the MIS function for
their metrics).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import metrics as M

# Miles' tag -> the project's name: the quantities ``metrics.PEER_NAMES`` names one Miles tag
# for (the MIS function's mis_* keys, logged under train/: loss.py:853-855; OPSM), and Miles'
# own loss and rollout metrics (loss.py:831-858, log_utils.py:96-).
TAGS: dict[str, str] = {
    **{miles: ours for ours, (miles, _) in M.PEER_NAMES.items() if " " not in miles},
    "train/grad_norm": M.GRAD_NORM,
    "train/pg_loss": M.PG_LOSS,
    "train/pg_clipfrac": M.PG_CLIPFRAC,
    "train/ppo_kl": M.PPO_KL,
    "train/kl_loss": M.KL_LOSS,
    "rollout/raw_reward": M.TRAIN_REWARD,
    "rollout/response_lengths": M.RESPONSE_LENGTH,
}
# The names only the MIS function reports (its mis_* keys), and every name this reader gives.
MIS_ONLY = frozenset(v for k, v in TAGS.items() if k.startswith("train/mis_"))
EMITTED = frozenset(TAGS.values()) | {M.K3_KL, M.ENTROPY, M.EVAL_REWARD}
K3_MIS = "train/mis_k3_kl"
K3_MILES = "train/train_rollout_kl"
# Miles' names for the entropy are negated losses: the entropy itself is -entropy_loss.
ENTROPY_LOSS = "train/entropy_loss"


class TensorBoardTail:
    """The event files under one directory, read from where the last poll stopped."""

    def __init__(self, directory: Path, last_logged: int, *, steps_per_rollout: int,
                 eval_tag: str | None, mis: bool) -> None:
        self.directory = Path(directory)
        self.last_logged = last_logged
        self.steps_per_rollout = max(1, steps_per_rollout)
        self.eval_tag, self.mis = eval_tag, mis
        self._loaders: dict[Path, Any] = {}
        self._pending: dict[int, dict[str, list[float]]] = {}

    def _read(self) -> None:
        # deferred: TensorBoard's loader only where a Miles run is followed
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        for path in sorted(self.directory.rglob("events.out.tfevents.*")):
            if path not in self._loaders:
                self._loaders[path] = EventFileLoader(str(path))
            for event in self._loaders[path].Load():
                for value in event.summary.value:
                    self._add(value.tag, int(event.step), _scalar(value))

    def _add(self, tag: str, tb_step: int, value: float | None) -> None:
        if value is None:
            return
        rollout = tb_step // self.steps_per_rollout if tag.startswith("train/") else tb_step
        step = rollout + 1
        if step <= self.last_logged:
            return  # logged by an earlier attempt (a resumed run re-reads its files)
        name = self._name(tag)
        if name is None:
            return
        value = -value if tag == ENTROPY_LOSS else value
        self._pending.setdefault(step, {}).setdefault(name, []).append(value)

    def _name(self, tag: str) -> str | None:
        if tag == (K3_MIS if self.mis else K3_MILES):
            return M.K3_KL
        if tag == ENTROPY_LOSS:
            return M.ENTROPY
        if self.eval_tag is not None and tag == f"eval/{self.eval_tag}":
            return M.EVAL_REWARD
        return TAGS.get(tag)

    def _take(self, upto: int | None) -> list[tuple[int, dict[str, float]]]:
        out = []
        for step in sorted(s for s in self._pending if upto is None or s < upto):
            readings = self._pending.pop(step)
            out.append((step, {k: sum(v) / len(v) for k, v in readings.items()}))
            self.last_logged = step
        return out

    def poll(self) -> list[tuple[int, dict[str, float]]]:
        """Steps that are complete (a later step has begun), oldest first."""
        self._read()
        if not self._pending:
            return []
        return self._take(max(self._pending))

    def flush(self) -> list[tuple[int, dict[str, float]]]:
        """Every step read so far (the run has ended)."""
        self._read()
        return self._take(None)


def _scalar(value: Any) -> float | None:
    """A summary value's number: ``simple_value`` (``add_scalar``'s default) or a 0-d tensor."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.tensor.float_val:
        return float(value.tensor.float_val[0])
    return None


def steps_per_rollout(section: Mapping[str, Any]) -> int:
    """Optimizer steps per rollout of a recipe's Miles arguments: rollout_batch_size x
    n_samples_per_prompt / global_batch_size (Miles' own num_steps_per_rollout)."""
    try:
        return max(1, int(section["rollout_batch_size"]) * int(section.get(
            "n_samples_per_prompt", 1)) // int(section["global_batch_size"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 1
