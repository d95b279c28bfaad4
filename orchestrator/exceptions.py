"""All errors the orchestrator raises on purpose.

``UserError`` subclasses are mistakes in what the user gave us (a grid file, a flag, a
checkpoint that is not there): the CLI prints their one-line message and exits with code 2,
without a traceback. Anything else is an internal error and keeps its traceback.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

MAX_WORD = 120  # a value echoed in a message (a key, a label) is cut to this many chars
# A path is the part of a message the user acts on ("delete it"), and a workdir on a shared file
# system is easily longer than MAX_WORD: a word with a "/" is kept whole up to this length.
MAX_PATH_WORD = 1024
MAX_MESSAGE = 2000
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD + 1},}}")
# Control characters a terminal acts on (ESC starts ANSI / OSC sequences), left in a message
# after its whitespace is joined: a name or value echoed from user input is shown escaped.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escaped(m: re.Match[str]) -> str:
    return ascii(m.group())[1:-1]


def clip(message: str) -> str:
    """One line, of bounded length: a 100k-character key in a grid must not become a 200 KB
    error. Each over-long word keeps its start and says how long it was."""
    def cut(m: re.Match[str]) -> str:
        word = m.group()
        if "/" in word and len(word) <= MAX_PATH_WORD:
            return word
        return f"{word[:MAX_WORD - 20]}...[{len(word)} chars]"

    text = _LONG_WORD.sub(cut, _CONTROL.sub(_escaped, " ".join(str(message).split())))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 20] + " ...[cut]"


class OrchestratorError(Exception):
    """Base class of every error raised by rl-ablate on purpose."""


class UserError(OrchestratorError, ValueError):
    """Bad input from the user; printed as one line, exit code 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # One line, always: a newline smuggled in by a value must not split the message; and
        # short: a value the user gave is echoed, and may be huge.
        super().__init__(clip(message))


class GridError(UserError):
    """A grid file (or a recipe it names) is invalid.

    The message has the form ``FILE:LINE: KEY.PATH: problem; allowed: ...; did you mean ...?``.
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
        allowed: Sequence[object] | None = None,
        got: object = None,
        fix: str | None = None,
    ) -> None:
        where = file or "<grid>"
        if line is not None:
            where = f"{where}:{line}"
        parts = [where]
        if key:
            parts.append(key)
        text = ": ".join(parts) + f": {problem}"
        if allowed is not None:
            shown = ", ".join(str(a) for a in list(allowed)[:20])
            if len(allowed) > 20:
                shown += ", ..."
            text += f"; allowed: {shown}"
        hint = (did_you_mean(got, allowed) if allowed is not None and got is not None
                and len(str(got)) <= 200 else None)
        if hint:
            text += f"; did you mean {hint!r}?"
        if fix:
            text += f"; fix: {fix}"
        self.file, self.line, self.key = file, line, key
        self.problem, self.fix = problem, fix  # for a caller that says where from itself
        super().__init__(text)


class BackendUnavailableError(UserError):
    """A backend (verl, Kubernetes) cannot run on this machine; the message says what to install."""


class CheckpointError(UserError):
    """A checkpoint to resume from is missing, corrupt or not portable to the target pool."""


class ConcurrencyError(UserError):
    """Another orchestrator process holds the grid's lease."""


class StateFileError(UserError):
    """A durable JSON state file is truncated or garbage: one line naming it and the fix."""


class GateFailed(OrchestratorError):
    """A grid's ``preflight`` gate refused its submission: not bad input, a measured result;
    the CLI prints its lines (one per configuration, then the refusal) and exits with code 1."""

    exit_code = 1

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = [clip(line) for line in lines]
        super().__init__(self.lines[-1] if self.lines else "preflight gate failed")


class IllegalTransition(RuntimeError):
    """A trial was asked to move between states that have no legal edge."""


class NumericFailure(OrchestratorError):
    """NaN/inf in a training step: a result (verdict numeric_failure), never retried."""


class InfraFailure(OrchestratorError):
    """A process, node or store failed under a trial: retried from its last checkpoint."""


class Preempted(InfraFailure):
    """The cluster took the trial's resources for other work (a Slurm job PREEMPTED): retried
    from the last checkpoint like any infra failure, but counted apart (``retries.preemptions``),
    so preemption on a busy cluster does not use up ``retries.max``."""


class DiskFullError(UserError):
    """The disk (or quota) under the workdir or the tracking store filled up: the submission
    stopped cleanly; freeing space and submitting again resumes every trial."""


def no_such_trial(trial_id: str, known: Iterable[str], *, where: str, see: str,
                  scope: str = "") -> UserError:
    """``{where}: no trial 'ID'{scope}; did you mean 'X'?`` (or ``; {see}`` without a close id):
    the one error for a trial id that is not there (``run-trial``, ``resume``, ``cancel``)."""
    hint = did_you_mean(trial_id, known)
    return UserError(f"{where}: no trial {trial_id!r}{scope}"
                     + (f"; did you mean {hint!r}?" if hint else f"; {see}"))


def did_you_mean(got: object, allowed: Iterable[object] | None) -> str | None:
    """The closest allowed value to ``got`` by spelling, if one is close enough."""
    if allowed is None:
        return None
    names = [str(a) for a in allowed]
    match = difflib.get_close_matches(str(got), names, n=1, cutoff=0.6)
    return match[0] if match else None
