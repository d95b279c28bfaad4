"""Synthetic task with a verifiable reward, and its tokenizer (built in code).

Prompt: ``BOS d_1 .. d_n SEP`` with n random digits; the answer has ``answer`` digits then EOS.
Tasks (``task.name``):

- ``progression`` (default): answer digit r_i = (r_{i-1} + step) mod 10 for i = 1..answer,
  with r_0 := d_1 and step = d_2 mod max_step + 1. One rule shared by every position, so credit from all positions
  teaches it; a tiny model learns it from scratch over ~40-250 steps (middle difficulty).
- ``sum_mod``: r_i = (r_{i-1} + d_{(i mod n)+1}) mod 10 from r_0 = 0 (hard: a 2-layer model
  stays near chance for 300 steps).
- ``reverse_sum``: the digits reversed, then pairwise sums (hard, position-specific copying).
- ``reverse``: the n digits reversed (a smoke-test task).

Each digit of a running task is checked against the model's *own* previous digit, so one
early mistake does not zero the rest (partial credit).

Reward = (positions correct + 1 if EOS comes right after the answer) / (answer length + 1),
in [0, 1]. The vocabulary has digits, specials, a second spelling of every digit (tokens 14..23,
both count as the digit: like an LLM's equivalent tokenisations, more correct continuations
keep the policy's entropy up for longer) and filler symbols the policy must learn to avoid.
"""
from __future__ import annotations

import dataclasses

import torch

DIGITS = 10
BOS, SEP, EOS, PAD = 10, 11, 12, 13
N_SPECIAL = 14
ALIAS = 14  # tokens 14..23 are a second spelling of the digits 0..9 (see digit_value)
TASKS = ("progression", "sum_mod", "reverse_sum", "reverse")


@dataclasses.dataclass(frozen=True)
class Task:
    name: str = "progression"
    digits: int = 3
    answer: int = 16  # answer length of progression / sum_mod / reverse_sum (reverse: digits)
    response_len: int = 18  # generation budget (answer + EOS + slack)
    vocab: int = 32
    max_step: int = 3  # progression: step = d_2 mod max_step + 1 (difficulty knob)
    aliases: bool = True  # tokens 14..23 also count as the digits 0..9

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task.name {self.name!r} is not one of {list(TASKS)}")
        if not 1 <= self.max_step <= DIGITS:
            raise ValueError(f"task.max_step must be in 1..{DIGITS}, got {self.max_step}")
        if self.vocab < ALIAS + DIGITS:
            raise ValueError(f"task.vocab must be >= {ALIAS + DIGITS}, got {self.vocab}")
        if self.response_len < self.answer_len + 1:
            raise ValueError(f"task.response_len must be >= {self.answer_len + 1} "
                             f"(answer + EOS) for task {self.name}, got {self.response_len}")

    @property
    def answer_len(self) -> int:
        return self.digits if self.name == "reverse" else self.answer

    @property
    def prompt_len(self) -> int:
        return self.digits + 2

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    def prompts(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """``n`` prompts [n, prompt_len] drawn with ``gen``."""
        d = torch.randint(0, DIGITS, (n, self.digits), generator=gen)
        return torch.cat([torch.full((n, 1), BOS), d, torch.full((n, 1), SEP)], dim=1)

    def reward(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Verifiable reward [B] of ``responses`` [B, response_len] (PAD after EOS)."""
        d = prompts[:, 1:1 + self.digits]
        a = self.answer_len
        resp = responses[:, :a]
        resp = digit_value(resp) if self.aliases else torch.where(resp < DIGITS, resp, -1)
        if self.name == "reverse":
            correct = resp == d.flip(1)
        elif self.name == "progression":
            prev = torch.cat([d[:, :1], resp[:, :-1]], dim=1)
            step = d[:, 1:2] % self.max_step + (self.max_step < DIGITS)
            correct = (resp == (prev + step) % DIGITS) & (prev >= 0)
        elif self.name == "reverse_sum":
            target = torch.cat([d.flip(1), (d + d.roll(-1, 1)) % DIGITS], dim=1)
            target = target.repeat(1, -(-self.answer // target.shape[1]))[:, :self.answer]
            correct = resp == target
        else:
            prev = torch.cat([torch.zeros_like(resp[:, :1]), resp[:, :-1]], dim=1)
            src = d.repeat(1, -(-self.answer // self.digits))[:, :self.answer]
            # The previous position must itself be a digit for the check to mean anything.
            correct = (resp == (prev + src) % DIGITS) & (prev >= 0)
        eos_ok = responses[:, a] == EOS
        return (correct.sum(1) + eos_ok).double() / (a + 1)


def digit_value(tokens: torch.Tensor) -> torch.Tensor:
    """0..9 for a digit in either spelling, -1 for any other token."""
    alias = (tokens >= ALIAS) & (tokens < ALIAS + DIGITS)
    return torch.where(tokens < DIGITS, tokens, torch.where(alias, tokens - ALIAS, -1))


def response_mask(responses: torch.Tensor) -> torch.Tensor:
    """1 for generated tokens up to and including the first EOS, 0 after (padding)."""
    is_eos = (responses == EOS).int()
    after = (is_eos.cumsum(1) - is_eos) > 0  # strictly after the first EOS
    return (~after).to(torch.float32)
