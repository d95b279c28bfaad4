"""Fixtures for the Kubernetes tests (helpers live in k8shelpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # k8shelpers, k8svalidate, kustomize

from k8shelpers import GPU_GRIDS


@pytest.fixture(params=GPU_GRIDS)
def gpu_grid(request: pytest.FixtureRequest) -> str:
    return request.param
