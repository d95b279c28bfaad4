"""A grid name stands for one grid: a different grid submitted under it is refused with the
differences and the ways out; a re-submit, the documented growth (more seeds or axis values)
and ``--extend`` run (``orchestrator.scheduler._identity``). No Ray: the refusal comes first."""

from __future__ import annotations

from pathlib import Path

import pytest
from rayclusters import write_grid

from orchestrator.cli import main
from orchestrator.exceptions import UserError
from orchestrator.grid import expand, load_grid
from orchestrator.scheduler import renamed
from orchestrator.scheduler._identity import as_submitted, check_identity
from orchestrator.store import workspace


def _grid(tmp: Path, file: str = "g.yaml", *, steps: int = 20, seeds: list[int] | None = None,
          levels: list[str] | None = None, par: int = 2):
    path = write_grid(tmp / file, "ident", steps=steps, seeds=seeds or [0],
                      levels=levels or ["token"], pools=["sim-h100"],
                      budget=f"{{max_parallel: {par}}}", retries=None, every=None, tiny=False)
    grid = load_grid(path)
    return grid, expand(grid)


def _check(grid, trials, **kw):
    return check_identity(grid, workspace.grid_dir(grid.name), trials, **kw)


def test_same_grid_and_budget_changes_pass_silently(isolated: Path) -> None:
    assert _check(*_grid(isolated)) is None
    assert _check(*_grid(isolated)) is None
    assert _check(*_grid(isolated, par=4)) is None  # a budget does not define trials


def test_growth_by_seeds_or_axis_values_is_the_documented_behaviour(isolated: Path) -> None:
    _check(*_grid(isolated))
    note = _check(*_grid(isolated, seeds=[0, 1]))
    assert note == "grid ident grows: seeds: [0] -> [0, 1]; 1 new trial(s)"
    note = _check(*_grid(isolated, seeds=[0, 1], levels=["token", "sequence"]))
    assert note is not None and "axes.correction.is_level: [\"token\"] -> [\"token\", \"sequence\"]" in note
    assert note.endswith("; 2 new trial(s)")


@pytest.mark.parametrize(("change", "shown"), [
    ({"steps": 30}, "steps: 20 -> 30"),
    ({"levels": ["sequence"]}, 'axes.correction.is_level: ["token"] -> ["sequence"]'),
    ({"seeds": [1]}, "seeds: [0] -> [1]"),
])
def test_another_grid_under_the_name_is_refused_with_the_difference(
    isolated: Path, change: dict, shown: str
) -> None:
    _check(*_grid(isolated))
    grid, trials = _grid(isolated, "other.yaml", **change)
    with pytest.raises(UserError) as info:
        _check(grid, trials)
    msg = str(info.value)
    assert msg.startswith(f"{grid.file}: grid 'ident' already ran in ") and shown in msg, msg
    assert "fix: submit it under a new name (`--name NEW`" in msg and "`--extend`" in msg
    # --extend adds its trials; afterwards the new grid is the one the name stands for
    assert _check(grid, trials, extend=True).startswith("grid ident extended (--extend): ")
    assert _check(grid, trials) is None
    with pytest.raises(UserError):
        _check(*_grid(isolated))  # and the first one now differs from it


def test_renamed_grid_has_its_own_identity_and_a_bad_name_is_refused(isolated: Path) -> None:
    _check(*_grid(isolated))
    grid, _ = _grid(isolated, "other.yaml", steps=30)
    other = renamed(grid, "ident-30")
    assert other.name == "ident-30" and _check(other, expand(other)) is None
    with pytest.raises(UserError, match="--name 'Bad_Name': not a grid name"):
        renamed(grid, "Bad_Name")


def test_submit_refuses_before_anything_starts(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check(*_grid(isolated))
    grid, _ = _grid(isolated, "other.yaml", steps=30)
    capsys.readouterr()
    assert main(["submit", grid.file, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in out + err, err
    assert "steps: 20 -> 30" in err
    grid_dir = workspace.grid_dir("ident")
    assert not (grid_dir / "trials").exists() and not (grid_dir / "grid.json").exists()
    assert not (isolated / ".ablate" / "mlflow.db").exists()


def test_the_backend_a_grid_was_submitted_with_is_the_one_resume_and_compare_use(isolated: Path) -> None:
    """``ablate submit GRID --backend slurm`` records its backend; ``as_submitted`` (asked by
    ``ablate resume``, ``compare`` and ``evaluate``, which take no ``--backend``) loads the grid
    with it, so they plan the trials that ran (ids cover the backend), under a ``--name`` too."""
    grid, _ = _grid(isolated)
    submitted = load_grid(grid.file, backend="slurm")
    ran = expand(submitted)
    _check(submitted, ran)
    again = as_submitted(load_grid(grid.file), workspace.grid_dir(grid.name))
    assert again.backend == "slurm" != grid.backend
    assert [t.trial_id for t in expand(again)] == [t.trial_id for t in ran]
    other = renamed(submitted, "ident-b")
    _check(other, expand(other))
    named = as_submitted(renamed(load_grid(grid.file), "ident-b"), workspace.grid_dir("ident-b"))
    assert (named.name, named.backend) == ("ident-b", "slurm")
    plain, _ = _grid(isolated, "plain.yaml")  # a grid submitted as its file says: itself
    assert as_submitted(plain, isolated / "nowhere") is plain
    (workspace.grid_dir(grid.name) / "identity.json").write_text("{torn")  # compare still reads
    assert as_submitted(grid, workspace.grid_dir(grid.name)) is grid
