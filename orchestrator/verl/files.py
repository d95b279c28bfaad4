"""verl's file protocol: what a running verl job leaves on disk, read the same way by every
launcher (this machine's ``supervise``, the Kubernetes launcher on the shared volume).

verl's ``file`` logger writes one ``{"step": N, "data": {...}}`` line per step to
``VERL_FILE_LOGGER_PATH`` (opened with "wb", so each attempt gets its own file): ``MetricTail``
tails it and ``normalise`` maps names to ``orchestrator/metrics.py``. verl's checkpoints
(``global_step_N`` + ``latest_checkpointed_iteration.txt``) are handed to ``ctx.save_checkpoint``
once step N's metrics are logged (``hand_over_checkpoint``); a resume lays the orchestrator's
checkpoint out as ``global_step_N`` again (``prepare_resume``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import metrics as M
from orchestrator.backends.base import RunContext
from orchestrator.store import link_tree

TRACKER = "latest_checkpointed_iteration.txt"
ZERO_ADV_METRIC = "health/zero_advantage"  # 1.0 when every advantage of the step is 0


# --------------------------------------------------------------------------- metric names


def loss_scaled(config: Mapping[str, Any]) -> bool:
    """Whether a trial's resolved config trains with a loss scaler: ``learner.precision: fp16``
    (verl 0.9.1 builds its ShardedGradScaler for an fp16 param dtype only,
    workers/engine/fsdp/transformer_impl.py:405-411)."""
    learner = config.get("learner") or {}
    return isinstance(learner, Mapping) and learner.get("precision") == "fp16"


def normalise(data: Mapping[str, Any], loss_scaled: bool = False) -> dict[str, float]:
    """verl's step metrics as floats, plus the shared names where verl's differ.

    ``loss_scaled`` (an fp16 learner): verl logs no skip flag; a step whose update its grad
    scaler skipped logs a non-finite ``actor/grad_norm`` (transformer_impl.py:798-834), so the
    project's ``fp16/skipped_share`` is derived from it: 1.0 on such a step (verl logs one norm per
    step, so a step with any update skipped counts as skipped), else 0.0."""
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # strings, lists (e.g. generations) are not metrics
        out[str(key)] = float(value)
    # Bypass mode: the loss logs the mismatch metrics under the actor's prefix (1e workaround).
    for key in list(out):
        if key.startswith("actor/rollout_corr/"):
            out.setdefault(key.removeprefix("actor/"), out[key])
    for verl_name, shared in M.VERL_ALIASES.items():
        if verl_name in out:
            out.setdefault(shared, out[verl_name])
    reward = _eval_reward(out)
    if reward is not None:
        out[M.EVAL_REWARD] = reward
    if loss_scaled and M.GRAD_NORM in out:
        out[M.SKIPPED_SHARE] = float(not math.isfinite(out[M.GRAD_NORM]))
    adv_max, adv_min = out.get("critic/advantages/max"), out.get("critic/advantages/min")
    if adv_max is not None and adv_min is not None:
        out[ZERO_ADV_METRIC] = float(adv_max == 0.0 and adv_min == 0.0)
    return out


def _eval_reward(m: Mapping[str, float]) -> float | None:
    """Mean over data sources of ``val-core/<source>/<var>/mean@N``: verl's core validation
    metric, ``acc`` when the reward function returns one, else the reward
    (``trainer/ppo/ray_trainer.py:725``; the other parts are under ``val-aux/``)."""
    for var in ("reward", "acc", "score"):
        vals = [v for k, v in m.items() if k.startswith("val-core/") and f"/{var}/mean@" in k
                and math.isfinite(v)]
        if vals:
            return sum(vals) / len(vals)
    return None


class MetricTail:
    """Reads complete lines of the file logger as they are written.

    verl logs one line per training step, after the step (and its checkpoint) is done. Lines at
    or below the last logged step (validation before training at step 0 or at the resume step)
    are carried into the next step, so steps reach ``ctx.log_metrics`` strictly increasing.
    """

    def __init__(self, path: Path, last_logged: int, loss_scaled: bool = False) -> None:
        self.path, self.offset, self.buf = path, 0, b""
        self.loss_scaled = loss_scaled  # fp16 learner: derive fp16/skipped_share (normalise)
        self.last_logged = last_logged
        self.carry: dict[str, float] = {}

    def poll(self) -> list[tuple[int, dict[str, float]]]:
        """Steps (strictly increasing, > last logged) that appeared since the last poll."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            if fh.seek(0, os.SEEK_END) < self.offset:  # truncated: a restart of the job
                self.offset, self.buf = 0, b""
            fh.seek(self.offset)
            chunk = fh.read()
            self.offset = fh.tell()
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")  # a torn last line waits for its end
        done = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step, data = int(rec["step"]), normalise(rec.get("data") or {}, self.loss_scaled)
            except (ValueError, KeyError, TypeError):
                continue  # a foreign line: skip it, the next one is independent
            if step <= self.last_logged:
                self.carry.update(data)
                continue
            done.append((step, {**self.carry, **data}))
            self.carry, self.last_logged = {}, step
        return done

    def flush(self) -> list[tuple[int, dict[str, float]]]:
        """Last read once the job has ended (nothing is held back between polls)."""
        return self.poll()


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(ckpt_dir: Path) -> int | None:
    try:
        return int((ckpt_dir / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def prepare_resume(ctx: RunContext, ckpt_dir: Path) -> str | None:
    """Lay out the orchestrator's checkpoint as verl's ``global_step_N`` and return its path."""
    if ctx.resume_step is None:
        return None
    step_dir = ckpt_dir / f"global_step_{ctx.resume_step}"
    if step_dir.exists():
        shutil.rmtree(step_dir)
    link_tree(ctx.checkpoint_path(ctx.resume_step), step_dir)
    (ckpt_dir / TRACKER).write_text(str(ctx.resume_step))
    return str(step_dir)


def hand_over_checkpoint(ctx: RunContext, ckpt_dir: Path, saved: int, logged: int) -> int:
    """Give verl's newest checkpoint to the orchestrator once its step's metrics are in."""
    step = latest_checkpoint(ckpt_dir)
    if step is None or step <= saved or step > logged:
        return saved
    src = ckpt_dir / f"global_step_{step}"
    if not src.is_dir():
        return saved
    ctx.save_checkpoint(step, lambda dst: link_tree(src, Path(dst)))
    return step
