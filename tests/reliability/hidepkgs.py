"""``python hidepkgs.py PKG[,PKG...] ARGS...``: ``ablate ARGS`` as it runs where those optional
packages are not installed: their imports raise ModuleNotFoundError and their distribution
metadata PackageNotFoundError, exactly what Python raises for an absent package (the test
machine has every extra installed, so absence is the one thing that cannot be real here)."""
from __future__ import annotations

import importlib.abc
import importlib.metadata as md
import sys

HIDDEN = {name.lower() for name in sys.argv[1].split(",")}


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0].lower() in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


_real = md.distribution


def _distribution(name: str) -> md.Distribution:
    if name.replace("-", "_").lower() in HIDDEN:
        raise md.PackageNotFoundError(name)
    return _real(name)


sys.meta_path.insert(0, _Hidden())
md.distribution = _distribution  # importlib.metadata.version() looks it up here

if __name__ == "__main__":
    from orchestrator.cli import main

    sys.exit(main(sys.argv[2:]))
