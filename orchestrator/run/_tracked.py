"""What a trial's MLflow run is sent under the grid's ``tracking: {every: N}`` (``metrics.jsonl``
keeps every step; ``_attempt.AttemptRun.commit`` applies this to each commit's rows)."""
from __future__ import annotations

from orchestrator.verdict import VerdictEngine


def verdict_steps(engine: VerdictEngine) -> set[int]:
    """The steps a verdict can name, as far as ``engine`` knows now: each episode's onset and
    fire step, the start of every streak in progress (the onset of a fire still to come) and
    the early warning's onset. (Here, not in ``orchestrator.verdict``: that module decides
    results' numbers, and this decides only what MLflow is sent.)"""
    out: set[int] = set()
    for rule in engine.rules:
        for f in [*rule.episodes, *([rule.firing] if rule.firing else [])]:
            out.update((f.onset, f.fired))
        if rule.streak.start is not None:
            out.add(rule.streak.start)
    if engine.warning is not None:
        out.update(s for s in (engine.warning.step, engine.warning.streak.start) if s is not None)
    return out


def tracked_rows(rows: list[tuple[int, dict[str, float]]], every: int, named: set[int],
                 prev_keys: frozenset[str]) -> tuple[list[tuple[int, dict[str, float]]], frozenset[str]]:
    """The rows of one commit that MLflow gets under ``tracking.every``: each N-th step, the
    commit's last step, the ``named`` steps, and each row with a metric its predecessor lacks
    (an eval every 7 steps is not thinned again to every 70th); and the last row's names."""
    out = []
    for i, (step, row) in enumerate(rows):
        keys = frozenset(row)
        if step % every == 0 or i == len(rows) - 1 or step in named or not keys <= prev_keys:
            out.append((step, row))
        prev_keys = keys
    return out, prev_keys
