"""Reference scores a trial's checkpoints got after the fact (``ablate evaluate``), in
``trials/<id>/reference.json``.

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
from typing import Any

from orchestrator.store._files import TrialPaths, atomic_write_json, corrupt_state_file, read_json


@dataclasses.dataclass
class ReferenceScores:
    """One trial's after-the-fact reference scores: step -> (reward, seconds it took)."""

    target: str  # eval.reference's target (``orchestrator/evaluation.py``)
    evaluator: str  # the trainer's version of that evaluator (e.g. ``sim-ref-1``)
    scores: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    sent: set[int] = dataclasses.field(default_factory=set)  # steps logged to the MLflow run

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "evaluator": self.evaluator,
                "scores": {str(s): {"reward": r, "seconds": t, "sent": s in self.sent}
                           for s, (r, t) in sorted(self.scores.items())}}

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
        return ReferenceScores(str(data["target"]), str(data["evaluator"]), scores, sent)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise corrupt_state_file(paths.reference, f"not a reference-score record ({exc})") from None


def write_reference(paths: TrialPaths, scores: ReferenceScores) -> None:
    atomic_write_json(paths.reference, scores.to_json())


__all__ = ["ReferenceScores", "read_reference", "write_reference"]
