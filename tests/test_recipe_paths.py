"""Recipe lookup against typos and links (issue 59, items 7 and 8): a ``recipes_dir:`` (or
``$ABLATE_RECIPES`` folder) that is mistyped, a file, a link loop or missing is a one-line plan
error, never the built-in recipe of that name; a recipe (or a file its ``defaults:`` names) that
is a link leaving the recipes folder is refused unread. Plan only, well under a second each."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[1]
GRID = "name: r\nrecipe: {recipe}\n{extra}steps: 4\npool: sim-a100\n"
SECRET = "shadow: root-hash-LEAKED\n"


@pytest.fixture
def proj(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("ABLATE_RECIPES", raising=False)
    own = isolated / "proj" / "my_recipes" / "sim"
    own.mkdir(parents=True)
    (own / "grpo_tiny.yaml").write_text((REPO / "recipes" / "sim" / "grpo_tiny.yaml").read_text())
    (isolated / "outside.yaml").write_text(SECRET)
    return isolated / "proj"


def _plan(proj: Path, capsys: pytest.CaptureFixture[str], *, recipe: str = "sim/grpo_tiny",
          extra: str = "") -> str:
    grid = proj / "g.yaml"
    grid.write_text(GRID.format(recipe=recipe, extra=extra))
    rc = main(["plan", str(grid)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err and out == "", (rc, err)
    assert err.startswith(f"error: {grid}") and "; fix: " in err and "LEAKED" not in err
    return err


@pytest.mark.parametrize(("name", "make", "problem"), [
    ("my_recipe", None, "'my_recipe' does not exist (did you mean 'my_recipes'?)"),
    ("afile", lambda p: p.write_text("x: 1\n"), "'afile' is a file, not a folder"),
    ("loop", lambda p: p.symlink_to(p), "'loop' is a symbolic link loop"),
    ("gone", lambda p: p.symlink_to(p.parent / "nowhere"), "'gone' does not exist"),
])
def test_a_recipes_dir_that_is_not_a_folder_is_refused_not_replaced_by_the_built_in(
        proj: Path, capsys: pytest.CaptureFixture[str], name: str, make, problem: str) -> None:
    if make is not None:
        make(proj / name)
    err = _plan(proj, capsys, extra=f"recipes_dir: {name}\n")
    assert f":3: recipes_dir: {problem}" in err, err


def test_a_missing_ablate_recipes_folder_is_refused(
        proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ABLATE_RECIPES", str(proj / "my_recipess"))
    assert "$ABLATE_RECIPES: " in _plan(proj, capsys)


@pytest.mark.parametrize("how", ["file", "folder", "defaults"])
def test_a_recipe_linked_out_of_its_folder_is_refused_unread(
        proj: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    sim = proj / "my_recipes" / "sim"
    if how == "file":
        (sim / "evil.yaml").symlink_to(proj.parent / "outside.yaml")
        recipe = "sim/evil"
    elif how == "folder":
        (proj / "my_recipes" / "ext").symlink_to(proj.parent)
        recipe = "ext/outside"
    else:  # a recipe of the folder whose defaults: list names a linked file
        (sim / "_evil.yaml").symlink_to(proj.parent / "outside.yaml")
        (sim / "mine.yaml").write_text("defaults:\n  - _evil\n  - grpo_tiny\n  - _self_\n")
        recipe = "sim/mine"
    err = _plan(proj, capsys, recipe=recipe, extra="recipes_dir: my_recipes\n")
    assert "is a link to a file outside the recipes folder" in err, err
    assert os.path.islink(sim / "evil.yaml") or how != "file"
