"""``submit`` and ``resume`` return typed reports (issue 54): the CLI reads their fields, and
each is its JSON document as a read-only mapping (``ablate submit --json``)."""
from __future__ import annotations

import json

import pytest

from orchestrator.scheduler import Resumed, ResumeReport, SubmitReport


def test_a_resume_report_types_what_the_cli_prints() -> None:
    doc = {"grid": "g", "not_resumed": {"t3": "its pool has no capacity"},
           "results": {"t1": {"verdict": {"kind": "healthy"}}, "t2": {"verdict": None}},
           "resumed": [{"trial_id": "t1", "parent": "t0", "pool": "sim-h100", "from_step": 5,
                        "derived": True},
                       {"trial_id": "t2", "parent": "t2", "pool": "sim-a100", "from_step": 0,
                        "derived": False}]}
    report = ResumeReport(doc)
    assert report.resumed == [Resumed("t1", "t0", "sim-h100", 5, True, "healthy"),
                              Resumed("t2", "t2", "sim-a100", 0, False, "?")]
    assert report.not_resumed == {"t3": "its pool has no capacity"}
    assert report["resumed"] == doc["resumed"] and dict(report) == doc
    with pytest.raises(TypeError):
        report["grid"] = "other"  # type: ignore[index]


def test_a_submit_report_is_its_summary() -> None:
    doc = {"grid": "g", "trials": 2, "states": {"done": 1, "failed": 1},
           "verdicts": {"healthy": 1}, "failed": [{"trial_id": "t2", "reason": "boom"}]}
    report = SubmitReport(doc)
    assert (report.grid, report.states, report.verdicts) == ("g", doc["states"], doc["verdicts"])
    assert report.failed == doc["failed"] and report.get("trials") == 2
    assert json.loads(json.dumps(report.to_json())) == doc
    assert not SubmitReport({"grid": "g", "failed": []}).failed
