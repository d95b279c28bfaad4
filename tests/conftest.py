"""Shared fixtures. Tests run from any cwd; state goes to tmp dirs, never the repo."""
from __future__ import annotations

import os
import sys
from pathlib import Path

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
