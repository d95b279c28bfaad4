"""What the docs quote exists: every ``orchestrator`` name, import, ``python -m`` module and
``orchestrator/`` path in the README files, ARCHITECTURE.md and the site's pages (``docs/``)
resolves against the package. The site itself is checked in ``tests/test_docs_site.py``."""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "ARCHITECTURE.md", "k8s/README.md", "recipes/verl/README.md",
        "orchestrator/sim/README.md",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
FROM_IMPORT = re.compile(r"from (orchestrator(?:\.\w+)*) import ([\w, ]+)")
DOTTED = re.compile(r"(?<![\w/.-])orchestrator(?:\.\w+)+")
RUN_MODULE = re.compile(r"python -m (orchestrator(?:\.\w+)*)")
PATH = re.compile(r"(?<![\w/.-])orchestrator/[\w./-]*")


def _resolve(dotted: str) -> object:
    """The module or attribute a dotted name refers to (raises if there is none)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def _quoted(doc: str) -> set[tuple[str, str]]:
    text = (REPO / doc).read_text()
    found = {("import", f"{m}.{n.strip()}") for m, names in FROM_IMPORT.findall(text)
             for n in names.split(",") if n.strip()}
    found |= {("name", d) for d in DOTTED.findall(text)}
    found |= {("module", m) for m in RUN_MODULE.findall(text)}
    found |= {("path", p.rstrip(".")) for p in PATH.findall(text)}
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_what_the_docs_quote_exists(doc: str) -> None:
    missing = []
    for kind, ref in sorted(_quoted(doc)):
        try:
            if kind == "path":
                assert (REPO / ref).exists()
            elif kind == "module":
                assert importlib.util.find_spec(ref) is not None
            else:
                _resolve(ref)
        except (AssertionError, ImportError, AttributeError):
            missing.append(f"{kind} {ref}")
    assert missing == []


def test_the_readme_quotes_the_public_api() -> None:
    names = {ref for _, ref in _quoted("README.md")}
    assert {"orchestrator.grid.load_grid", "orchestrator.grid.expand",
            "orchestrator.scheduler.submit", "orchestrator.compare.compare"} <= names
    for dotted in ("orchestrator.grid.load_grid", "orchestrator.scheduler.submit",
                   "orchestrator.compare.compare"):
        assert callable(_resolve(dotted))


def test_architecture_names_and_packages_match_the_tree() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    heads = {p.stem for p in (REPO / "orchestrator").iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()}
    dotted = {d for d in re.findall(r"`([a-z_][a-z0-9_]*(?:\.\w+)+)`", text)
              if d.split(".")[0] in heads}
    assert dotted, "ARCHITECTURE.md names nothing of the package"
    for name in sorted(dotted):
        _resolve("orchestrator." + name)
    listed = set(re.findall(r"^\| `(\w+)/` \|", text, re.MULTILINE))
    packages = {p.parent.name for p in (REPO / "orchestrator").glob("*/__init__.py")}
    assert listed == packages


def test_the_grid_walkthrough_documents_every_top_level_key() -> None:
    """Every top-level key of the grid schema appears in "Writing grids" as ``key:``, in its
    examples or its text, so no grid feature is missing where users learn the format (the
    generated reference lists every key anyway: tests/test_docs_site.py)."""
    from orchestrator.schema import GridFile

    page = (REPO / "docs/grids.md").read_text()
    missing = [k for k in GridFile.model_fields if not re.search(rf"(?<![\w.]){re.escape(k)}:", page)]
    assert missing == [], f"docs/grids.md does not mention {missing}; document them there"


def test_the_readme_is_the_front_page() -> None:
    """The README stays a front page (at most 250 lines) with the two commands CI and users
    run, and links only to pages that exist or are listed as coming (see README's table)."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for marker in ("<!-- quickstart-command -->", "<!-- test-command -->"):
        block = text.split(marker, 1)[1].split("```", 2)[1]
        assert block.startswith("bash\n") and "pip install" in block
    assert "'.[test,verl,k8s,docs]'" in text.split("<!-- test-command -->", 1)[1].split("```", 2)[1]
