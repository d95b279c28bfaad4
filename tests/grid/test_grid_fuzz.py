"""Property-based fuzzing of the grid loader: whatever the file holds, `ablate plan` exits 0 or 2
with a one-line message, never a traceback, and never writes anything."""
from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main

BASE = {
    "name": "fuzz",
    "recipe": "sim/grpo_tiny",
    "backend": "sim",
    "steps": 10,
    "seeds": [0],
    "axes": {"correction.is_level": ["none", "token"], "pool": ["sim-h100"]},
}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(string.printable, max_size=30),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(string.ascii_letters + "._-", max_size=20), inner, max_size=4)),
    max_leaves=12)
keys = st.sampled_from(["name", "recipe", "backend", "steps", "seeds", "axes", "exclude", "include",
                        "overrides", "budget", "collapse", "early_stop", "search", "pool",
                        "checkpoint", "retries", "on_collapse", "bogus",
                        "axes.correction.is_level", "axes.pool", "axes.train.lr", "axes.engine"])


def _mutate(key: str, value: object) -> dict:
    grid = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    if key.startswith("axes."):
        grid["axes"][key.removeprefix("axes.")] = value
    else:
        grid[key] = value
    return grid


def _check(tmp: Path, text: str | bytes, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp / "g.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    rc = main(["plan", str(path), "--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if rc == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert out == "", out  # a refused grid prints no plan
    assert "Traceback" not in err
    assert not (tmp / ".ablate").exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys, value=values)
def test_structured_mutations(key: str, value: object, isolated: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    _check(isolated, yaml.safe_dump(_mutate(key, value), allow_unicode=True), capsys)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check(isolated, data, capsys)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=400), junk=st.text(max_size=20))
def test_truncated_and_spliced_text(cut: int, junk: str, isolated: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = yaml.safe_dump(BASE)
    _check(isolated, text[:cut] + junk + text[cut:], capsys)
