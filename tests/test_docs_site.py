"""The documentation site (``mkdocs.yml``, ``docs/``): it builds with zero warnings, every
``ablate`` command it or the README shows runs at least to ``ablate plan``, and its generated
reference pages cover the whole schema, every vocabulary and every CLI option."""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
HOOKS = REPO / "docs" / "_hooks"
sys.path.insert(0, str(HOOKS))  # the generators, as MkDocs loads them


def _load_hooks() -> Any:
    """docs/_hooks/main.py, the MkDocs hook module, under a name of its own."""
    spec = importlib.util.spec_from_file_location("ablate_docs_hooks", HOOKS / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()

PAGES = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


# --------------------------------------------------------------------------- the build

def test_the_site_builds_strictly_with_every_generated_page(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds with no warning, and the generated content and the
    images from results/ are in the built site."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d",
                           str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "WARNING" not in log, log[-3000:]
    site = tmp_path / "site"
    assert "seeds.adaptive.ci_width" in (site / "grid-reference/index.html").read_text()
    vocab = (site / "vocabularies/index.html").read_text()
    assert "algorithm.rollout_correction.rollout_is='token'" in vocab
    assert "mis.yaml tis_level" in vocab  # the Miles column
    assert "ablate resume" in (site / "cli/index.html").read_text()
    assert "Content-hashed ids" in (site / "architecture/index.html").read_text()
    start = (site / "getting-started/index.html").read_text()
    for image in re.findall(r"assets/results/[\w/.-]+\.png", start):
        assert (site / image).is_file(), image
    assert "assets/results/quickstart/verdict_map.png" in start
    assert "{{" not in (site / "benchmarks/index.html").read_text()


def test_a_page_asking_for_what_does_not_exist_fails_the_build() -> None:
    with pytest.raises(hooks.DocsError, match="no 'nope'"):
        hooks.expand("{{ results/benchmarks/verl_cpu.json#nope }}", "x.md")
    with pytest.raises(hooks.DocsError, match="no such file"):
        hooks.expand("<!-- include:NOPE.md -->", "x.md")
    with pytest.raises(hooks.DocsError, match="no generated section"):
        hooks.expand("<!-- gen:nope -->", "x.md")


def test_values_and_tables_are_read_from_results() -> None:
    import json

    data = json.loads((REPO / "results/benchmarks/verl_cpu.json").read_text())
    ratio = data["ratio_ablate_over_bare"]["wall_s_median"]
    text = hooks.expand("{{ results/benchmarks/verl_cpu.json#ratio_ablate_over_bare.wall_s_median|.2f }}")
    assert text == f"{ratio:.2f}"
    cost = data["ablate"]["wall_s_median"]
    assert hooks.expand("{{ results/benchmarks/verl_cpu.json#ablate.wall_s_median|x2:.1f }}") \
        == f"{cost * 2:.1f}"
    table = hooks.expand("<!-- table:results/quickstart/summary.md 1 -->")
    assert table.startswith("| correction |") and table.count("\n") >= 4


# --------------------------------------------------------------------------- commands

def _commands(page: str) -> list[str]:
    """Every `ablate ...` command in the page's ```bash blocks (continuations joined, comments
    dropped, `&&` chains split)."""
    out = []
    for block in FENCE.findall((REPO / page).read_text()):
        block = re.sub(r"\\\n\s*", " ", block)
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in re.split(r"\s*(?:&&|;|\|\|)\s*", line):
                if part.startswith("ablate "):
                    out.append(part)
    return out


COMMANDS = sorted({(page, cmd) for page in PAGES for cmd in _commands(page)})


def test_the_pages_show_commands() -> None:
    pages = {page for page, _ in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/grids.md"} <= pages
    assert len(COMMANDS) >= 15


def _grid_file(name_or_path: str) -> Path:
    """The grid a command names: a file, or a grid name (``ablate status quickstart``)."""
    path = REPO / name_or_path
    if path.is_file():
        return path
    if path.name == "grid.yaml" and not path.parent.exists():  # written by `ablate init DIR`
        return REPO / "orchestrator" / "templates" / "grid.yaml"
    for candidate in sorted(REPO.glob("grids/**/*.yaml")) + sorted(REPO.glob("benchmarks/*.yaml")):
        if re.search(rf"^name:\s*{re.escape(name_or_path)}\s*$", candidate.read_text(), re.MULTILINE):
            return candidate
    raise AssertionError(f"no grid file or grid named {name_or_path!r}")


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_every_documented_command_parses_and_its_grid_plans(page: str, command: str) -> None:
    """The real parser accepts the command (a renamed flag fails here), and the grid it names
    plans (``load_grid`` + ``expand``, what ``ablate plan`` runs, with its ``--backend``). A
    trial id it names must be a trial of that grid, a pool a pool of its catalogue. Commands
    are not run past the plan: submit, resume and ui need Ray, MLflow and minutes each, and
    the trials they would run are the ones planned here."""
    from orchestrator.cli import build_parser
    from orchestrator.grid import expand, load_grid

    argv = shlex.split(command)[1:]
    parser = build_parser()
    # Docs spell options in full: an abbreviation would hide a renamed flag (--collapse).
    for sub in [parser, *_options_parsers(parser)]:
        sub.allow_abbrev = False
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{page}: `{command}` is refused by the parser (exit {exc.code})")
    grid_arg = getattr(args, "grid", None)
    if grid_arg is None:
        return
    grid = load_grid(_grid_file(grid_arg), backend=getattr(args, "backend", None))
    trials = expand(grid, force=True)
    ids = {t.trial_id for t in trials}
    named = getattr(args, "trial", None) or []
    for trial in [named] if isinstance(named, str) else named:  # run-trial takes one
        assert trial in ids, f"{page}: `{command}` names trial {trial}, not a trial of {grid_arg}"
    pool = getattr(args, "pool", None)
    if pool is not None:
        assert pool in grid.pools.pools, f"{page}: `{command}` names pool {pool}, not in the catalogue"


# --------------------------------------------------------------------------- generated pages

def _schema_fields() -> dict[str, set[str]]:
    """Model name -> its fields, from the JSON schema (not from the generator's own walk)."""
    from orchestrator.schema import GridFile

    schema = GridFile.model_json_schema()
    out = {"GridFile": set(schema["properties"])}
    for name, definition in schema.get("$defs", {}).items():
        if "properties" in definition:
            out[name] = set(definition["properties"])
    return out


def test_the_grid_reference_covers_every_schema_field() -> None:
    """Each model of the schema has its section, and each of its fields a row there."""
    page = hooks.generated("grid-reference")
    sections = dict(re.findall(r"\{#(\w+)\}\n(.*?)(?=\n## |\Z)", page, re.DOTALL))
    for model, fields in _schema_fields().items():
        assert model.lower() in sections, f"no section for {model}"
        keys = {k.rsplit(".", 1)[-1] for k in re.findall(r"^\| `([^`]+)` \|", sections[model.lower()], re.MULTILINE)}
        assert fields <= keys, f"{model}: no rows for {sorted(fields - keys)}"


def test_every_grid_key_says_what_it_means() -> None:
    """A key's meaning comes from the schema (description, comment, docstring) or from
    docs/_hooks/grid_keys.yaml; a key with neither fails here, naming where to write it."""
    from grid_reference import meanings, sections
    from modeldoc import field_text, model_text

    from orchestrator.grid import SECTIONS
    from orchestrator.schema import GridFile

    extra = meanings()
    missing, known = [], set()
    for model, paths in sections(GridFile):
        prefix = paths[0] + "." if paths[0] else ""
        for name in model.model_fields:
            known.add(prefix + name)
            if not (field_text(model, name) or extra.get(prefix + name)
                    or f"`{name}`" in model_text(model)):
                missing.append(prefix + name)
    for section, model in SECTIONS.items():
        known |= {f"{section}.{name}" for name in model.model_fields}
    assert missing == [], (f"grid keys without a meaning: {missing}; add a comment next to the "
                           "field in orchestrator/schema.py or a line to docs/_hooks/grid_keys.yaml")
    assert set(extra) <= known, f"docs/_hooks/grid_keys.yaml explains keys that do not exist: {sorted(set(extra) - known)}"


def test_the_vocabulary_page_covers_every_vocabulary_key_and_maps_to_verl() -> None:
    from orchestrator.grid import SECTIONS

    page = hooks.generated("vocabularies")
    for section, model in SECTIONS.items():
        assert f"## `{section}.*`" in page
        for name in model.model_fields:
            assert f"### `{section}.{name}`" in page, f"{section}.{name} missing"
    # What verl 0.9.1 gets and refuses, as the mapping in code says (verl/mapping.py).
    assert "`algorithm.rollout_correction.rollout_rs='seq_mean_k1'`" in page
    assert "refused: verl 0.9.1 has no geometric IS weights" in page
    assert "`+actor_rollout_ref.rollout.engine_kwargs.sglang.enable_fp32_lm_head=true`" in page


def _options_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]


def _options(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = [s for a in sub._actions for s in a.option_strings if s != "-h"
                             and s != "--help"]
    return out


def test_the_cli_reference_covers_every_command_and_option() -> None:
    from orchestrator.cli import build_parser

    page = hooks.generated("cli")
    commands = _options(build_parser())
    assert {"plan", "submit", "status", "compare", "resume", "cancel", "ui", "run-trial",
            "env"} <= set(commands)
    for name, options in commands.items():
        section = page.split(f"## `ablate {name}`", 1)[1].split("\n## ", 1)[0]
        for option in options:
            assert f"`{option}" in section, f"ablate {name} {option} missing"
