"""The package's layout stays what ARCHITECTURE.md says: no import circles (imports for type
checkers counted: a circle they close is a circle in the design), imports inside functions only
where they defer something (with the reason next to them), private modules imported only inside
their own package, a face for every package, no file over 450 lines and at most 12 modules
directly in ``orchestrator/``."""
from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchestrator

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


ROOT_LAZY = dict.fromkeys(orchestrator._FROM_GRID, "orchestrator.grid")
MAX_LINES = 450
MAX_TOP_LEVEL_MODULES = 12


def _imports(name: str) -> Iterator[tuple[str, int, bool, list[str], bool]]:
    """(imported module, line, inside a function, the lines of its import block, only for type
    checkers) per internal import of module ``name``."""
    path = MODULES[name]
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            # The root package's lazy names import their package on first use (PEP 562): an
            # import of one is an import of that package, which the layer order must see.
            targets += [ROOT_LAZY[a.name] for a in node.names
                        if node.module == "orchestrator" and a.name in ROOT_LAZY]
        else:
            continue
        targets = [t for t in targets if t in MODULES and t != name]
        if not targets:
            continue
        up, in_function, typing_only = parents.get(node), False, False
        while up is not None:
            in_function |= isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef))
            typing_only |= isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test)
            up = parents.get(up)
        top = node.lineno - 1
        while top > 0 and (not lines[top - 1].strip()
                           or lines[top - 1].strip().startswith(("import ", "from "))):
            top -= 1
        block = lines[max(top - 1, 0):node.end_lineno]
        yield max(targets, key=len), node.lineno, in_function, block, typing_only


def _graph(*, with_functions: bool) -> dict[str, set[str]]:
    """Module -> modules its import runs: the imported module and every package ``__init__``
    on its path (importing ``a.b.c`` runs ``a.b`` first), except the importer's own parents."""
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for target, _, in_function, _, _ in _imports(name):
            if in_function and not with_functions:
                continue
            parts = target.split(".")
            for cut in range(2, len(parts) + 1):
                dep = ".".join(parts[:cut])
                if dep in MODULES and dep != name and not name.startswith(dep + "."):
                    edges[name].add(dep)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("with_functions", [False, True], ids=["module level", "all imports"])
def test_no_import_circles(with_functions: bool) -> None:
    assert _cycles(_graph(with_functions=with_functions)) == []


def test_imports_inside_functions_say_why() -> None:
    # An import for type checkers never runs, so it defers nothing and needs no reason.
    unexplained = [f"{name}:{line} -> {target}" for name in MODULES
                   for target, line, in_function, block, typing_only in _imports(name)
                   if in_function and not typing_only and not any("#" in text for text in block)]
    assert unexplained == []


def test_private_modules_are_imported_only_inside_their_package() -> None:
    leaks = []
    for name in MODULES:
        for target, line, _, _, _ in _imports(name):
            parts = target.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
            owner = ".".join(parts[:private]) if private is not None else None
            if owner is not None and name != owner and not name.startswith(owner + "."):
                leaks.append(f"{name}:{line} -> {target}")
    assert leaks == []


@pytest.mark.parametrize("package", sorted(n for n, p in MODULES.items() if p.name == "__init__.py"))
def test_every_package_states_what_it_owns(package: str) -> None:
    module = importlib.import_module(package)
    assert (module.__doc__ or "").strip(), f"{package} has no docstring"
    for public in getattr(module, "__all__", []):
        assert hasattr(module, public), f"{package}.__all__ names {public!r}, which it lacks"


def test_no_file_is_over_the_line_limit() -> None:
    """A file that grows past the limit is split by concern, not trimmed."""
    long = sorted(f"{path.relative_to(PACKAGE.parent)}: {n} lines" for path in PACKAGE.rglob("*.py")
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert long == []


def test_few_modules_sit_directly_in_the_package() -> None:
    """The top level holds the shared vocabulary; a concept with several modules is a package."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def _layers() -> list[set[str]]:
    """ARCHITECTURE.md's layer order, bottom first: the code block after ``<!-- layers -->``,
    one layer a line (its first line is the top-level vocabulary)."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- layers -->", 1)[1].split("```", 2)[1]
    lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
    return [{TOP}] + [set(ln.split()) for ln in lines[1:]]


TOP = "(top level)"


def _package(module: str) -> str | None:
    """The package a module belongs to (``TOP`` for a top-level module); None for the package's
    own face and entry point (``orchestrator``, ``orchestrator.__main__``)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return None
    return parts[1] if (PACKAGE / parts[1] / "__init__.py").exists() else TOP


def test_the_layer_order_lists_every_package() -> None:
    listed = [p for layer in _layers() for p in layer]
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} | {TOP}
    assert sorted(listed) == sorted(packages), "each package on exactly one line of the order"


def test_no_package_imports_upward_or_sideways() -> None:
    """Every import between packages goes to a lower layer of ARCHITECTURE.md's order: none up,
    none between two packages of one layer (imports inside functions and for type checkers
    count)."""
    rank = {p: i for i, layer in enumerate(_layers()) for p in layer}
    wrong = []
    for name, targets in _graph(with_functions=True).items():
        here = _package(name)
        for target in targets:
            there = _package(target)
            if here is None or there is None or here == there:
                continue
            if rank[there] >= rank[here]:
                wrong.append(f"{name} -> {target} ({here} may not import {there})")
    assert sorted(wrong) == []


BENCHMARKS = PACKAGE.parent / "benchmarks"
# benchmarks/findings_rejudge.py is hashed by results/findings/MANIFEST.json: its import of
# compare._survival moves with the next regeneration of the findings (92 min on this host).
PRIVATE_ALLOWED = {("findings_rejudge.py", "orchestrator.compare._survival")}


def test_benchmarks_use_the_public_api_only() -> None:
    """A benchmark measures what a user runs: it imports the packages' faces, never a private
    module or a private name (which a refactor may change under it without a word)."""
    leaks = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator"):
                names = [node.module] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("orchestrator")]
            else:
                continue
            private = any(part.startswith("_") and part != "__version__"
                          for name in names for part in name.split("."))
            if private and (path.name, getattr(node, "module", None)) not in PRIVATE_ALLOWED:
                leaks.append(f"benchmarks/{path.name}:{node.lineno} {ast.unparse(node)}")
    assert leaks == []
