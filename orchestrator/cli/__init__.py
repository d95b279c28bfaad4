"""The ``ablate`` command line: the parser and ``plan``/``env`` (``parser``), the other commands,
each a thin call into one library function (``commands``), what keeps a closed pipe, a missing
extra or a path the OS refuses from becoming a traceback (``guard``), and ``ablate env``'s
facts (``environment``). Nothing below this package imports it.
"""
from __future__ import annotations

from orchestrator.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
