"""The tiny verifiable task a 2-layer model can learn by GRPO: copy or reverse a digit string.

The prompt is a short string of digits; the answer is the same digits (``copy``) or the digits
reversed (``reverse``), followed by the end-of-sequence token. The reward lives in
:mod:`orchestrator.verl.cpu.reward` (a standalone file, because verl loads it by path).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from orchestrator.verl.cpu.reward import DATA_SOURCE_PREFIX

TASKS = ("copy", "reverse")


@dataclass(frozen=True)
class TaskSpec:
    """What the data set asks: the transformation and the prompt lengths (inclusive range)."""

    name: str = "copy"
    min_digits: int = 1
    max_digits: int = 2

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task {self.name!r}: expected one of {TASKS}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"digit range [{self.min_digits}, {self.max_digits}] is empty")

    @property
    def data_source(self) -> str:
        """verl groups validation metrics by ``data_source`` (``val-core/<data_source>/...``)."""
        return f"{DATA_SOURCE_PREFIX}/{self.name}"

    def target(self, digits: str) -> str:
        return digits if self.name == "copy" else digits[::-1]

    def sample(self, rng: random.Random) -> str:
        n = rng.randint(self.min_digits, self.max_digits)
        return "".join(rng.choice("0123456789") for _ in range(n))


