"""The verl tests run ``ablate`` as a user does (``tests/cliproc.py``)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cliproc
import pytest


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of ``ablate`` run in ``tmp_path`` (workdir ``tmp_path/.ablate``)."""
    with cliproc.ablate_env(tmp_path) as env:
        yield env
