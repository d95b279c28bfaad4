"""Corrupt state files met by ``ablate status`` (no Ray: the files are written by hand).

Truncated or garbage JSON in a trial's state file is that trial's problem, not the grid's: the
trial is shown as "unreadable" and one warning line names the file and the fix, while the other
trials are shown as usual (exit code 0); grid-level files the orchestrator rewrites anyway (lease,
queue, cancel requests) are tolerated. A state file that is valid JSON of the wrong shape is as
corrupt as garbage, and so is one holding another trial's records.
The end-to-end recovery (follow the fix, submit again, nothing lost) is in ``test_faults.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import relhelpers as H

from orchestrator.cli import main
from orchestrator.exceptions import StateFileError
from orchestrator.store import TrialPaths, records


@pytest.fixture
def trial_dir(isolated: Path) -> TrialPaths:
    t, paths = H.saved_trial(isolated, "shapes", steps=4)
    records.save_state(paths, records.TrialRecord(trial_id=t.trial_id))
    return paths


@pytest.fixture
def healthy(trial_dir: TrialPaths) -> TrialPaths:
    """A second trial of the same grid whose records are fine (spec and state by hand)."""
    spec = records.load_spec(trial_dir)
    assert spec is not None
    other = dataclasses.replace(spec, trial_id="t0123456789ab", seed=spec.seed + 1)
    paths = TrialPaths(trial_dir.root.parent.parent, other.trial_id)
    records.save_spec(paths, other)
    records.save_state(paths, records.TrialRecord(trial_id=other.trial_id))
    return paths


def _one_warning(err: str, target: Path) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("warning: trial ") and str(target) in lines[0], err
    assert "; fix: " in lines[0], err


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
    assert rc == 0, err
    _one_warning(err, target)
    assert f"{target}: corrupt JSON state file (" in err


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
    assert rc == 0, err
    _one_warning(err, trial_dir.state)


def test_one_unreadable_trial_leaves_the_others_shown(
    trial_dir: TrialPaths, healthy: TrialPaths, capsys: pytest.CaptureFixture[str]
) -> None:
    trial_dir.state.write_bytes(b'{"trunc')
    capsys.readouterr()
    assert main(["status", "shapes", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    by_id = {t["trial_id"]: t for t in view["trials"]}
    bad = by_id[trial_dir.root.name]
    assert bad["state"] == "unreadable" and str(trial_dir.state) in bad["unreadable"]
    assert by_id[healthy.root.name]["state"] == "pending" and not by_id[healthy.root.name]["unreadable"]


@pytest.mark.parametrize("name", ["state", "spec"])
def test_a_folder_holding_another_trials_records_is_not_read_as_that_trial(
    trial_dir: TrialPaths, healthy: TrialPaths, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Another trial's spec.json or state.json copied into this trial's folder: never read as
    this trial's (its id would file the other's numbers under this trial)."""
    target = getattr(trial_dir, name)
    target.write_bytes(getattr(healthy, name).read_bytes())
    rc, err = _status(capsys)
    assert rc == 0, err
    _one_warning(err, target)
    assert f"holds the records of trial {healthy.root.name}, not of trial {trial_dir.root.name}" in err
    with pytest.raises(StateFileError):
        if name == "state":
            records.load_state(trial_dir, trial_dir.root.name)
        else:
            records.load_spec(trial_dir)
