"""A trial's ``reference.json``: scores of the steps a resume replaces are dropped with their
checkpoints, and sending to MLflow marks only what was sent (``store/reference.py``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.store import TrialPaths
from orchestrator.store.reference import (
    ReferenceScores,
    drop_reference_after,
    read_reference,
    send_reference,
    write_reference,
)


@pytest.fixture
def paths(tmp_path: Path) -> TrialPaths:
    p = TrialPaths(tmp_path, "t0123456789ab")
    p.root.mkdir(parents=True)
    write_reference(p, ReferenceScores("trainer", "verl-cpu-ref-1",
                                       {1: (0.1, 0.5), 2: (0.2, 0.4), 3: (0.3, 0.4)}, {1, 2}))
    return p


def test_a_resume_drops_the_scores_of_the_steps_it_replaces(paths: TrialPaths) -> None:
    drop_reference_after(paths, 3)  # nothing after step 3: the file is untouched
    assert sorted(read_reference(paths).scores) == [1, 2, 3]
    drop_reference_after(paths, 1)
    held = read_reference(paths)
    assert held.scores == {1: (0.1, 0.5)} and held.sent == {1}
    drop_reference_after(paths, 0)  # a fresh start: no score of the discarded run stands
    assert read_reference(paths) is None and not paths.reference.exists()


def test_only_what_was_sent_is_marked_sent(paths: TrialPaths) -> None:
    held = read_reference(paths)
    assert send_reference(paths, held, None, lambda run, values: None) == 1  # no run yet

    def down(run: str, values: dict[int, float]) -> None:
        raise ConnectionError("store down")

    assert send_reference(paths, held, "r1", down) == 1
    assert read_reference(paths).sent == {1, 2}
    got: list[tuple[str, dict[int, float]]] = []
    assert send_reference(paths, held, "r1", lambda run, values: got.append((run, values))) == 0
    assert got == [("r1", {3: 0.3})] and read_reference(paths).sent == {1, 2, 3}
    assert send_reference(paths, read_reference(paths), "r1", down) == 0  # nothing left to send
