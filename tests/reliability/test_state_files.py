"""Corrupt state files met by ``ablate status`` (no Ray: the files are written by hand).

Truncated or garbage JSON in a trial's state file gives one line naming the file and the fix,
exit code 2; grid-level files the orchestrator rewrites anyway (lease, queue, cancel requests)
are tolerated. A state file that is valid JSON of the wrong shape is as corrupt as garbage.
The end-to-end recovery (follow the fix, submit again, nothing lost) is in ``test_faults.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import relhelpers as H

from orchestrator.cli import main
from orchestrator.store import TrialPaths, records


@pytest.fixture
def trial_dir(isolated: Path) -> TrialPaths:
    t, paths = H.saved_trial(isolated, "shapes", steps=4)
    records.save_state(paths, records.TrialRecord(trial_id=t.trial_id))
    return paths


def _status(capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["status", "shapes"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


GARBAGE = {
    "empty": b"",
    "truncated": b'{"schema_version": 1, "state": "run',
    "binary": b"\x00\xff\xfe\x80garbage",
    "latin1": '{"trial_id": "caf\xe9"}'.encode("latin-1"),
    "two_documents": b'{"state": "done"}{"state": "done"}',
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
@pytest.mark.parametrize("name", ["state", "spec"])
def test_garbage_trial_file_is_one_line_naming_it_and_the_fix(
    trial_dir: TrialPaths, capsys: pytest.CaptureFixture[str], name: str, data: bytes
) -> None:
    target = getattr(trial_dir, name)
    target.write_bytes(data)
    rc, err = _status(capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {target}: corrupt JSON state file (") and "; fix: " in err


@pytest.mark.parametrize("name", ["lease.json", "queue.json", "cancel.json"])
def test_garbage_grid_files_the_orchestrator_rewrites_are_tolerated(
    trial_dir: TrialPaths, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    (trial_dir.root.parent.parent / name).write_bytes(b'{"trunc')
    rc, err = _status(capsys)
    assert rc == 0, err


WRONG_SHAPE = {"list": [], "string": "x", "bad_state": {"state": "bogus"}, "null": None}


@pytest.mark.parametrize("data", WRONG_SHAPE.values(), ids=WRONG_SHAPE.keys())
def test_wrong_shape_state_file_is_one_line_too(
    trial_dir: TrialPaths, capsys: pytest.CaptureFixture[str], data: object
) -> None:
    trial_dir.state.write_text(json.dumps(data))
    rc, err = _status(capsys)
    assert rc == 2 and err.count("\n") == 1 and str(trial_dir.state) in err, err
