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
