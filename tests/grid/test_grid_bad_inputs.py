"""Every malformed grid in tests/data/bad_grids/ is rejected by `ablate plan` with exit code 2,
one line naming the file and the problem, no traceback, and nothing written to disk."""
from __future__ import annotations

import os
from pathlib import Path

import cliproc
import pytest

from orchestrator.cli import main

BAD = Path(__file__).parents[1] / "data" / "bad_grids"
NO_HEADER = {"utf16.yaml": "not UTF-8"}


def _expect(path: Path) -> str:
    if path.name in NO_HEADER:
        return NO_HEADER[path.name]
    first = path.read_bytes().split(b"\n", 1)[0].decode("latin-1")
    assert first.startswith("# expect: "), f"{path.name} lacks an '# expect:' header"
    return first.removeprefix("# expect: ").strip()


CASES = sorted(BAD.glob("*.yaml"))


def test_corpus_is_large() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_grid_rejected(path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}"), lines[0]
    assert _expect(path) in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
    assert not (isolated / ".ablate").exists()


@pytest.mark.parametrize("name", ["unknown_axis_value", "python_tag"])
def test_cli_subprocess_exit_code_two(name: str, isolated: Path) -> None:
    proc = cliproc.run(["plan", str(BAD / f"{name}.yaml")], os.environ, isolated, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (isolated / ".ablate").exists()


def test_error_names_line_key_allowed_and_suggestion(isolated: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", str(BAD / "unknown_axis_value.yaml")])
    err = capsys.readouterr().err
    assert ":8: axes.correction.is_level[1]: 'geometrc'" in err
    assert "allowed: none, token, sequence, geometric" in err
    assert "did you mean 'geometric'?" in err


def test_over_limit_passes_with_force(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(BAD / "over_trial_limit.yaml"), "--force", "--json"]) == 0
    assert '"count": 4' in capsys.readouterr().out


OWNED = Path(__file__).parents[1] / "data" / "owned_grids"
OWNED_CASES = sorted(OWNED.glob("*.yaml"))


@pytest.mark.parametrize("path", OWNED_CASES, ids=[p.stem for p in OWNED_CASES])
def test_a_catalogue_setting_what_the_tool_owns_is_refused(
        path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pool's verl_overrides, verl_env or slurm.extra that would replace what the trainer or
    launcher sets for every trial (or is not a plain key / variable name): refused at plan in one
    line at the catalogue's file and line, naming the pool field, exit 2, nothing written."""
    rc = main(["plan", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    catalog = path.read_text().split("pool_catalog: ../", 1)[1].split()[0]
    assert lines[0].startswith("error: ") and catalog in lines[0], lines[0]
    assert _expect(path) in lines[0] and "; fix: " in lines[0], lines[0]
    assert lines[0].count("fix:") == 1, lines[0]
    assert "Traceback" not in err and out == ""
    assert not (isolated / ".ablate").exists()


def test_the_built_in_catalogue_sets_nothing_the_tool_owns() -> None:
    from orchestrator import backends
    from orchestrator.pools import load_catalog

    catalog = load_catalog()
    for name, pool in catalog.pools.items():
        for kind in ("sim", "verl", "slurm"):
            b = backends.backend(kind)
            if pool.kind in b.pool_kinds:
                assert not b.problems(backends.TrialConfig.of({}, pool),
                                      stages=frozenset({"pool"})), (name, kind)
