"""Pool catalogues: read like grid files, names that can become labels, pools that can run."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.exceptions import GridError
from orchestrator.pools import BUILTIN_CATALOG, POOL_NAME, load_catalog


def _catalog(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    load_catalog.cache_clear()
    return str(path)


def test_builtin_catalogue_names_are_dns_labels() -> None:
    names = load_catalog().names()
    assert "sim-h100" in names and "cpu-fp32" in names  # merge keys of pools.yaml still work
    assert all(POOL_NAME.fullmatch(n) for n in names)
    assert BUILTIN_CATALOG.is_file()


@pytest.mark.parametrize("name", ["Bad_Pool", "pool;rm", "-x", "x-", "a" * 64, "ümlaut", "a.b",
                                  "pool\n"])
def test_pool_names_must_be_dns_labels(tmp_path: Path, name: str) -> None:
    path = _catalog(tmp_path, f"pools:\n  {name!r}:\n    kind: sim\n    accelerator: x\n")
    with pytest.raises(GridError, match="is not a DNS-style name") as exc:
        load_catalog(path)
    assert f"{path}:2: pools:" in str(exc.value)


def test_capacity_zero_is_refused(tmp_path: Path) -> None:
    path = _catalog(tmp_path, "pools:\n  idle:\n    kind: sim\n    accelerator: x\n"
                              "    capacity: 0\n")
    with pytest.raises(GridError, match=r":5: pools\.idle\.capacity: capacity 0: a pool must "
                                        r"host at least one trial"):
        load_catalog(path)


def test_catalogue_numbers_are_decimal(tmp_path: Path) -> None:
    path = _catalog(tmp_path, "pools:\n  p:\n    kind: sim\n    accelerator: x\n"
                              "    capacity: 010\n")
    with pytest.raises(GridError, match="octal-looking"):
        load_catalog(path)


def test_a_good_catalogue_merges(tmp_path: Path) -> None:
    path = _catalog(tmp_path, "pools:\n  my-pool:\n    kind: sim\n    accelerator: x\n"
                              "    capacity: 3\n")
    cat = load_catalog(path)
    assert cat.get("my-pool").capacity == 3 and "sim-h100" in cat
