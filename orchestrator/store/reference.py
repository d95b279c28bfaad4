"""Reference scores of a trial's checkpoints, in ``trials/<id>/reference.json``: made after the
fact (``ablate evaluate``), or by the runner as each checkpoint is saved for a trainer whose
evals cannot run the reference in-process (verl: ``Evaluator.at_checkpoints``).

A trial of a grid with ``eval: {reference: ...}`` logs ``eval/reward_ref`` with its other
metrics (``metrics.jsonl``, the source of truth). A trial that ran without it (a grid recorded
before the key existed, or one that did not set it) can have its saved checkpoints scored later
by the same evaluator; those scores live here, beside its metrics and never inside them (its
metric stream is what the trial itself logged). ``ablate compare`` reads both: a step the
trial logged keeps its own value.

The file is written atomically after each scored step, so an interrupted ``ablate evaluate``
keeps what it finished and a second run scores only what is missing.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.store._files import TrialPaths, atomic_write_json, corrupt_state_file, read_json

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ReferenceScores:
    """One trial's after-the-fact reference scores: step -> (reward, seconds it took)."""

    target: str  # eval.reference's target (``orchestrator/evaluation.py``)
    evaluator: str  # the trainer's version of that evaluator (e.g. ``sim-ref-1``)
    scores: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    sent: set[int] = dataclasses.field(default_factory=set)  # steps logged to the MLflow run
    # The rate of the evaluator's seconds (``cost.pool_rate``): an evaluation job holds its
    # pool's accelerators; None: one accelerator of the trial's own unit (in-process scoring).
    rate: tuple[int, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "evaluator": self.evaluator,
                               "scores": {str(s): {"reward": r, "seconds": t, "sent": s in self.sent}
                                          for s, (r, t) in sorted(self.scores.items())}}
        if self.rate is not None:
            out["accelerators"], out["unit"] = self.rate
        return out

    @property
    def seconds(self) -> float:
        return sum(t for _, t in self.scores.values())


def read_reference(paths: TrialPaths) -> ReferenceScores | None:
    """The trial's reference scores, or None when it has none; a malformed file is a one-line
    ``StateFileError`` naming it."""
    if not paths.reference.exists():
        return None
    data = read_json(paths.reference)
    try:
        scores = {int(s): (float(v["reward"]), float(v["seconds"]))
                  for s, v in data["scores"].items()}
        sent = {int(s) for s, v in data["scores"].items() if v.get("sent") is True}
        rate = (int(data["accelerators"]), str(data["unit"])) if "unit" in data else None
        return ReferenceScores(str(data["target"]), str(data["evaluator"]), scores, sent, rate)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise corrupt_state_file(paths.reference, f"not a reference-score record ({exc})") from None


def write_reference(paths: TrialPaths, scores: ReferenceScores) -> None:
    atomic_write_json(paths.reference, scores.to_json())


def send_reference(paths: TrialPaths, scores: ReferenceScores, run_id: str | None,
                   send: Callable[[str, dict[int, float]], None]) -> int:
    """Send the scores the trial's MLflow run ``run_id`` lacks with ``send(run_id, {step:
    value})`` and record them as sent; returns how many are left unsent (no run yet, or the
    send failed: the file is the record, the next ``ablate evaluate`` sends them)."""
    unsent = sorted(set(scores.scores) - scores.sent)
    if not unsent:
        return 0
    if run_id is None:
        return len(unsent)
    try:
        send(run_id, {s: scores.scores[s][0] for s in unsent})
    except Exception as exc:  # noqa: BLE001 - a store outage must not lose or fail anything
        log.warning("reference scores of %s not sent to MLflow: %s", paths.root.name, exc)
        return len(unsent)
    scores.sent.update(unsent)
    write_reference(paths, scores)
    return 0


def drop_reference_after(paths: TrialPaths, step: int) -> None:
    """Forget the scores of the steps after ``step`` (a resume before them replaces those
    checkpoints; ``step`` 0: a fresh start, the whole file)."""
    held = read_reference(paths)
    if held is None or all(s <= step for s in held.scores):
        return
    if step <= 0:
        paths.reference.unlink(missing_ok=True)
        return
    held.scores = {s: v for s, v in held.scores.items() if s <= step}
    held.sent &= set(held.scores)
    write_reference(paths, held)


__all__ = ["ReferenceScores", "drop_reference_after", "read_reference", "send_reference",
           "write_reference"]
