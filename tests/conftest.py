"""Shared fixtures. Tests run from any cwd; state goes to tmp dirs, never the repo."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sim import numerics

# Before anything imports torch: every simulator number a test checks (the golden run, the
# calibration bounds) holds on any x86-64 AVX2 machine only under the pinned numerics, and the
# Ray workers and `ablate` subprocesses the tests start inherit them.
assert "torch" not in sys.modules, "torch was imported before tests/conftest.py pinned numerics"
numerics.apply(True)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp cwd with its own workdir and tracking store; recipes still resolve to the repo's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_WORKDIR", str(tmp_path / ".ablate"))
    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


def pytest_configure(config: pytest.Config) -> None:
    # Keep Ray and torch polite on a 2-core machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")




# How the suite splits over pytest-xdist's workers (``pytest -n 2``, the README's test command):
# each test file runs whole on one worker, so its module-scoped setup (a
# verl grid, an MLflow server) runs once; the files below share one worker and run one after
# another, because each of them takes the whole machine (a verl or vLLM job on every core) or a
# session-wide cluster (Slurm). Without ``-n`` nothing here changes what runs or its order.
SERIAL_GROUPS = {"tests/verl_cpu/": "engines", "tests/vllm_cpu/": "engines",
                 "tests/slurm/": "slurm"}
FIRST_GROUP = "engines"  # the longest: it starts first so no worker idles at the end


def scope_of(nodeid: str) -> str:
    """The unit of work one worker takes whole: a serial group, else the test's file."""
    path = nodeid.split("::", 1)[0]
    return next((g for prefix, g in SERIAL_GROUPS.items() if path.startswith(prefix)), path)


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduler with ``scope_of``'s units (its ``xdist_group`` marks
        would do this, but xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9
        no longer reads, so the marks are silently ignored)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)  # `-p no:xdist` runs without it
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") not in ("load", "loadfile", "loadscope"):
            return None  # ``--dist each``, ``worksteal``...: the caller's choice
        config.option.loadscopereorder = False  # keep the order set below
        return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (only workers collect what runs), order the units of work: the
    engines group first, then the units holding a ``slow`` test, then the rest, each unit's
    tests in their own order."""
    if not hasattr(config, "workerinput"):
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(scope_of(item.nodeid), []).append(item)
    ordered = sorted(units.items(), key=lambda u: (
        u[0] != FIRST_GROUP, not any(i.get_closest_marker("slow") for i in u[1])))
    items[:] = [item for _, unit in ordered for item in unit]
