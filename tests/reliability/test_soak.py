"""The soak run of ``benchmarks/soak.py`` (200 tiny real-simulator trials on the embedded local
Ray): the orchestrator's open files, processes and memory stay flat. Marker ``soak``: it takes
10-20 minutes on 2 cores and is deselected by default (``pytest -m soak``)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "soak.py"


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_200_trials_keep_processes_files_and_memory_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    for k in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    with tempfile.TemporaryDirectory(prefix="soak", dir="/tmp") as tmp:
        monkeypatch.setenv("ABLATE_WORKDIR", tmp)  # soak.run points it there; restored after
        res = soak.run(200, 4, 2, 1.0, Path(tmp))
    soak.print_figures(res)
    f = res["figures"]
    assert res["states"] == {"done": 200}
    assert f["window"]["samples"] >= 20
    for key, limit in soak.LIMITS.items():
        assert abs(f[key]["slope_per_100_trials"]) < limit, (key, f[key])
    assert (
        f["fds"]["end"] <= f["fds"]["start"] + 10
        and f["children"]["end"] <= f["children"]["start"] + 3
    )
    a = res["after_shutdown"]
    assert a["children"] == 0  # submit's Ray shutdown left no process behind
    assert a["fds"] <= f["fds"]["start"]
