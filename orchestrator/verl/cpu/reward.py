"""The reward of the tiny task, as verl's custom reward hook loads it: a standalone file.

verl 0.9.1 loads ``reward.custom_reward_function.path`` with ``importlib.util.spec_from_file_location``
and calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``
(``experimental/reward_loop/reward_manager/naive.py``). The module is executed without being
registered in ``sys.modules``, so it must stay plain functions and constants (a ``@dataclass``
defined here fails with "'NoneType' object has no attribute '__dict__'") and must not import
this package, torch or verl.

The response is decoded with ``skip_special_tokens=True`` and the rollout stops at EOS, so the
length of the decoded answer tells whether (and where) the model stopped. The score has two parts:

* ``char``: matching positions / max(len(answer), len(target)) -- a long answer is penalised even
  if its prefix is right, so full marks need the model to stop;
* ``length``: 1 / (1 + |len(answer) - len(target)|) -- a dense signal towards emitting EOS at the
  right place, which a randomly initialised model never does on its own.
"""
from __future__ import annotations

from typing import Any

DATA_SOURCE_PREFIX = "ablate_cpu"
CHAR_WEIGHT = 0.7
LENGTH_WEIGHT = 0.3


def score_answer(answer: str, target: str) -> dict[str, float]:
    """The score parts for one decoded answer (see the module docstring)."""
    # No strip(): trailing blanks instead of EOS must not earn full marks.
    matches = sum(a == t for a, t in zip(answer, target))
    char = matches / max(len(answer), len(target), 1)
    length = 1.0 / (1.0 + abs(len(answer) - len(target)))
    return {
        "score": CHAR_WEIGHT * char + LENGTH_WEIGHT * length,
        "acc": float(answer == target),
        "char": char,
        "length_match": float(len(answer) == len(target)),
    }


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None, **_: Any) -> dict[str, float]:
    """verl's custom reward hook: a dict with ``score`` (the reward) plus extra metrics.

    The extra keys become ``val-core/<data_source>/<key>/mean@N`` (and ``val-aux``) in validation.
    """
    if not str(data_source).startswith(DATA_SOURCE_PREFIX):
        raise ValueError(f"compute_score got data_source {data_source!r}; this reward only "
                         f"scores the {DATA_SOURCE_PREFIX}/* tasks")
    return score_answer(solution_str, str(ground_truth))
