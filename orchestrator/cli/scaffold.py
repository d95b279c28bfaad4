"""``ablate init [DIR]``: a starter grid (and with ``--pools`` a pool catalogue) to edit.

The files are package data (``orchestrator/templates``), read with ``importlib.resources``.
"""
from __future__ import annotations

import argparse
import importlib.resources
import os
from pathlib import Path

from orchestrator.exceptions import UserError
from orchestrator.store import atomic_write_text

GRID = "grid.yaml"
POOLS = "pools.yaml"


def _template(name: str) -> str:
    return importlib.resources.files("orchestrator").joinpath("templates", name).read_text(
        encoding="utf-8")


def starter_files(pools: bool) -> dict[str, str]:
    """File name -> text of what ``ablate init`` writes."""
    grid = _template(GRID)
    files = {GRID: grid}
    if pools:
        files[GRID] = grid.replace("backend: sim\n", f"backend: sim\npool_catalog: {POOLS}\n", 1) \
            .replace("  pool: [sim-h100, sim-a100]\n", "  pool: [sim-a100, my-sim-fp8]\n", 1)
        files[POOLS] = _template(POOLS)
    return files


def init_command(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        raise UserError(f"ablate init: {target} is a file, not a folder; fix: name a folder "
                        "(it is created if missing)")
    files = starter_files(args.pools)
    # lexists: a link (dangling too) is a clash, and is replaced below, never written through.
    clash = [n for n in files if os.path.lexists(target / n)]
    if clash and not args.force:
        raise UserError(f"ablate init: {', '.join(str(target / n) for n in clash)} already "
                        "exists; fix: pass --force to overwrite, or name another folder")
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            # A new file renamed over the name: a grid.yaml that is a link out of the folder
            # is replaced by the file, and what it points at is left as it was.
            atomic_write_text(target / name, lambda fh, text=text: fh.write(text))
    except OSError as exc:
        raise UserError(f"ablate init: cannot write {target}: {exc.strerror or exc}; fix: name "
                        "a folder you can write") from None
    grid = target / GRID
    print(f"wrote {', '.join(str(target / n) for n in files)}")
    print(f"next: ablate plan {grid} && ablate submit {grid} && ablate compare {grid}")
    return 0
