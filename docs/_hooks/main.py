"""MkDocs hooks (``mkdocs.yml``: ``hooks:``): the reference pages are generated from the code and
the figures read from ``results/`` at every build, so the site cannot drift from either.

Markers a page may hold (each replaced at build time; an unknown one fails the build):

- ``<!-- gen:grid-reference -->``: every key of a grid file (``orchestrator/schema.py``);
- ``<!-- gen:vocabularies -->``: every vocabulary value and what each backend does with it;
- ``<!-- gen:cli -->``: every command and option (``orchestrator/cli/parser.py``'s parser);
- ``<!-- include:PATH -->``: a repository file's Markdown (e.g. ``ARCHITECTURE.md``);
- ``<!-- table:PATH N -->``: the N-th Markdown table of a repository file (e.g. a summary.md);
- ``<!-- jsontable:PATH[#a.b] x,y:.2f -->``: a table of fields x, y of a JSON list of objects
  (the file, or its list at a.b);
- ``{{ PATH#a.b.0.c|FORMAT }}``: one value of a JSON file under ``results/``, formatted with
  Python's format spec (``.2f``, ``.0%``, ...), optionally scaled first (``x3600:.0f``).

Every image under ``results/`` is served at ``assets/results/...``.
"""
from __future__ import annotations

import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

HOOKS = Path(__file__).resolve().parent
REPO = HOOKS.parents[1]


def _on_path() -> None:
    """This directory (the generators) and the repository (an uninstalled checkout) importable.
    MkDocs restores sys.path after loading this file, so the build calls this again."""
    for path in (str(REPO), str(HOOKS)):
        if path not in sys.path:
            sys.path.insert(0, path)


_on_path()

MARKER = re.compile(r"<!-- (gen|include|table|jsontable):\s*(.*?)\s*-->")
VALUE = re.compile(r"\{\{\s*(results/[^#\s]+)#([^|\s}]+)(?:\|([^}\s]+))?\s*\}\}")
IMAGES = (".png", ".svg", ".jpg")


class DocsError(Exception):
    """A page asks for something that does not exist (the build fails with this)."""


def on_config(config: Any) -> Any:
    _on_path()
    return config


@cache
def generated(name: str) -> str:
    if name == "grid-reference":
        from grid_reference import render as grid_render

        from orchestrator.schema import GridFile
        return grid_render(GridFile)
    if name == "vocabularies":
        from grid_reference import meanings
        from vocab_reference import render as vocab_render

        from orchestrator.grid import SECTIONS
        return vocab_render(SECTIONS, meanings(), examples())
    if name == "cli":
        from cli_reference import render as cli_render

        from orchestrator.cli import build_parser
        return cli_render(build_parser())
    if name == "states":
        return _states()
    if name == "default-rules":
        return _default_rules()
    raise DocsError(f"no generated section {name!r} (known: grid-reference, vocabularies, cli, "
                    "states, default-rules)")


def _states() -> str:
    """The trial state machine, from ``orchestrator/trial.py`` (its one table of legal moves and
    the comments written beside it)."""
    import inspect

    from modeldoc import cell

    from orchestrator import trial

    comments = _enum_comments(trial.TrialState)
    why: dict[str, list[str]] = {}
    pending: list[str] = []
    source = inspect.getsource(trial).split("_TRANSITIONS", 1)[1].split("\n}", 1)[0]
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#"):
            pending.append(text.lstrip("# "))
        elif m := re.match(r"TrialState\.(\w+):", text):
            why[m.group(1)] = pending
            pending = []
    rows = ["| state | meaning | may move to | why |", "|---|---|---|---|"]
    for state in trial.TrialState:
        moves = ", ".join(f"`{s.value}`" for s in trial.TrialState
                          if s in trial._TRANSITIONS[state])  # the one table of legal moves
        rows.append(f"| `{state.value}` | {cell(comments.get(state.name, ''))} | {moves} | "
                    f"{cell(' '.join(why.get(state.name, [])))} |")
    return "\n".join(rows)


def _enum_comments(cls: type) -> dict[str, str]:
    import inspect
    import io
    import tokenize

    out: dict[str, str] = {}
    source = inspect.getsource(cls)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = source.splitlines()[tok.start[0] - 1]
            name = line.split("=")[0].strip()
            if name.isidentifier():
                out[name] = tok.string.lstrip("# ")
    return out


def _default_rules() -> str:
    """The default collapse rules, from ``orchestrator/verdict/_rules.py``."""
    from orchestrator.verdict import DEFAULT_RULES

    rows = ["| rule | metric | kind | threshold | window | patience | min_step | min_delta | verdict |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in DEFAULT_RULES:
        rows.append(f"| `{r.name}` | `{r.metric}` | `{r.kind}` | {r.threshold:g} | {r.window} | "
                    f"{r.patience} | {r.min_step} | {r.min_delta:g} | `{r.verdict}` |")
    return "\n".join(rows)


def examples() -> dict[str, list[Any]]:
    """Example values for vocabulary keys whose type has no closed set of choices."""
    import yaml

    return yaml.safe_load((HOOKS / "examples.yaml").read_text()) or {}


def _repo_file(rel: str) -> Path:
    path = (REPO / rel).resolve()
    if REPO not in path.parents or not path.is_file():
        raise DocsError(f"{rel}: no such file in the repository")
    return path


def nth_table(text: str, n: int, rel: str) -> str:
    """The n-th (1-based) Markdown table of ``text``."""
    tables = re.findall(r"(?:^\|.*\|[ \t]*\n)+", text + "\n", flags=re.MULTILINE)
    if not 1 <= n <= len(tables):
        raise DocsError(f"{rel} has {len(tables)} tables, not {n}")
    return tables[n - 1].rstrip("\n")


def _lookup(data: Any, dotted: str, rel: str) -> Any:
    for part in dotted.split("."):
        try:
            data = data[int(part)] if isinstance(data, list) else data[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise DocsError(f"{rel} has no {dotted!r} (at {part!r})") from None
    return data


def _format(value: Any, spec: str | None) -> str:
    if not spec:
        return str(value)
    if spec.startswith("x"):  # x3600:.0f: scale, then format
        factor, _, spec = spec[1:].partition(":")
        value = value * float(factor)
    return format(value, spec)


def json_value(rel: str, dotted: str, spec: str | None) -> str:
    return _format(_lookup(json.loads(_repo_file(rel).read_text()), dotted, rel), spec)


def json_table(arg: str) -> str:
    """``PATH a,b:.3g,c``: one row per object of a JSON list, one column per field."""
    where, _, fields = arg.partition(" ")
    rel, _, dotted = where.partition("#")
    rows = json.loads(_repo_file(rel).read_text())
    if dotted:
        rows = _lookup(rows, dotted, rel)
    if not isinstance(rows, list):
        raise DocsError(f"{rel} is not a JSON list")
    cols = [(f.partition(":")[0], f.partition(":")[2] or None) for f in fields.split(",")]
    out = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        out.append("| " + " | ".join(_format(_lookup(row, c, rel), spec) for c, spec in cols)
                   + " |")
    return "\n".join(out)


def expand(markdown: str, where: str = "") -> str:
    """A page's Markdown with every marker and value replaced."""
    def marker(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "gen":
            return generated(arg)
        if kind == "include":
            return _repo_file(arg).read_text()
        if kind == "jsontable":
            return json_table(arg)
        rel, _, n = arg.rpartition(" ")
        return nth_table(_repo_file(rel).read_text(), int(n), rel)

    try:
        markdown = MARKER.sub(marker, markdown)
        return VALUE.sub(lambda m: json_value(m.group(1), m.group(2), m.group(3)), markdown)
    except DocsError as exc:
        raise DocsError(f"{where}: {exc}") from None


# --------------------------------------------------------------------------- MkDocs events

def on_files(files: Any, config: Any) -> Any:
    """Serve the images under results/ (plots, screenshots) at assets/results/."""
    from mkdocs.structure.files import File

    for path in sorted((REPO / "results").rglob("*")):
        if path.suffix in IMAGES and path.is_file():
            uri = "assets/" + path.relative_to(REPO).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown, page.file.src_uri)
