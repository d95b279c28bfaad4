"""Trial records on disk: the typed resume request keeps state.json's format, and one listing of
a grid's trials serves every reader."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from orchestrator.store import ResumeRequest, TrialPaths, TrialRecord, records
from orchestrator.trial import TrialSpec

SPEC = TrialSpec(trial_id="t1", grid="g", backend="sim", recipe="sim/grpo_tiny", pool="sim-h100",
                 seed=0, steps=10, axes=(("pool", "sim-h100"),), overrides=())


def test_a_resume_request_is_saved_under_its_three_keys(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path, "t1")
    request = ResumeRequest(pool="sim-h20", start=15, reason="ablate resume")
    records.save_state(paths, TrialRecord(trial_id="t1", resume=request))
    assert json.loads(paths.state.read_text())["resume"] == {
        "pool": "sim-h20", "start": 15, "reason": "ablate resume"}
    assert records.load_state(paths, "t1").resume == request


def test_a_state_file_from_an_existing_workdir_loads_its_request(tmp_path: Path) -> None:
    paths = TrialPaths(tmp_path, "t1")
    paths.root.mkdir(parents=True)
    paths.state.write_text(json.dumps({
        "schema_version": 1, "trial_id": "t1", "state": "pending", "pool": "sim-h100",
        "resume": {"pool": "sim-a100", "start": "latest", "reason": "on_collapse rescue"}}))
    rec = records.load_state(paths, "t1")
    assert rec.resume == ResumeRequest("sim-a100", "latest", "on_collapse rescue")
    assert records.route_pool(rec, SPEC) == "sim-a100"
    rec.resume = None  # consumed by the next attempt
    records.save_state(paths, rec)
    assert json.loads(paths.state.read_text())["resume"] is None
    assert records.route_pool(records.load_state(paths, "t1"), SPEC) == "sim-h100"


def test_the_trials_of_a_grid_are_the_directories_with_a_spec(tmp_path: Path) -> None:
    for tid in ("t3", "t1", "t2"):
        records.save_spec(TrialPaths(tmp_path, tid), _spec(tid))
    (tmp_path / "trials" / "t0").mkdir()  # no spec.json: not a trial
    (tmp_path / "trials" / "t4").mkdir()
    (tmp_path / "trials" / "t4" / "spec.json").mkdir()  # a folder named spec.json: not one either
    (tmp_path / "trials" / ".t5").mkdir()  # hidden: an editor's or a copy's, not a trial
    (tmp_path / "trials" / ".t5" / "spec.json").write_text("{}")
    (tmp_path / "trials" / "t6.json").write_text("{}")  # a file, not a trial's folder
    assert records.trial_ids(tmp_path) == ["t1", "t2", "t3"]
    assert records.trial_ids(tmp_path / "elsewhere") == []  # no trials folder: no trials
    assert list(records.known_trials(tmp_path)) == ["t1", "t2", "t3"]
    assert records.known_trials(tmp_path)["t2"] == _spec("t2")


def test_the_outbox_keeps_its_directory_name() -> None:
    assert TrialPaths(Path("/w/g"), "t1").outbox == Path("/w/g/trials/t1/mlflow-buffer")


def _spec(tid: str) -> TrialSpec:
    return dataclasses.replace(SPEC, trial_id=tid)


def test_written_files_get_the_mode_a_plain_write_gives(tmp_path, capsys) -> None:
    """Records, results and ``ablate init``'s files are readable as the umask allows (0644
    under 022), not the 0600 of the temp file they are renamed from; a file that exists keeps
    its own mode."""
    import stat

    from orchestrator.cli import main
    from orchestrator.store import atomic_write_json

    def mode(p):
        return stat.S_IMODE(p.stat().st_mode)

    fresh = tmp_path / "state.json"
    atomic_write_json(fresh, {"a": 1})
    assert mode(fresh) == 0o666 & ~_current_umask()
    fresh.chmod(0o640)
    atomic_write_json(fresh, {"a": 2})
    assert mode(fresh) == 0o640
    assert main(["init", str(tmp_path / "lab"), "--pools"]) == 0
    capsys.readouterr()
    assert {p.name: mode(p) for p in (tmp_path / "lab").iterdir()} == {
        "grid.yaml": 0o666 & ~_current_umask(), "pools.yaml": 0o666 & ~_current_umask()}


def _current_umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask
