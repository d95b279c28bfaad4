"""The first process of a Miles trial's job, where it runs (a Ray job, a RayJob's driver, a
Slurm step): ``python3 -m orchestrator.miles.entry --checkout DIR --mis JSON -- ARGS``.

It writes the trial's ``mis.yaml`` (``--mis``: its keys as JSON, ``null`` for none) to a folder
of its own, puts that file's path where ``ARGS`` hold ``job.MIS_PLACEHOLDER``, changes to the
Miles checkout with it on ``PYTHONPATH`` (``examples.*`` imports from there, as Miles' own
scripts run it) and replaces itself with ``python train.py ARGS``: the process Ray or Slurm
watches is Miles itself. Standard library and PyYAML only; no shell.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from orchestrator.miles.job import MIS_PLACEHOLDER


def prepare(checkout: str, mis_json: str, args: list[str]) -> list[str]:
    """The argv of ``train.py`` (checked before anything is replaced), ``mis.yaml`` written."""
    root = Path(checkout)
    if not (root / "train.py").is_file():
        raise SystemExit(f"miles entry: {root}/train.py not found; fix: point the pool's "
                         "miles.checkout at a Miles checkout on this node")
    mis = json.loads(mis_json)
    if mis is not None:
        path = Path(tempfile.mkdtemp(prefix="ablate-mis-")) / "mis.yaml"
        path.write_text(yaml.safe_dump(mis, sort_keys=False))
        args = [str(path) if a == MIS_PLACEHOLDER else a for a in args]
    elif MIS_PLACEHOLDER in args:
        raise SystemExit("miles entry: the arguments name a mis.yaml but --mis is null")
    return [sys.executable, "train.py", *args]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.miles.entry")
    parser.add_argument("--checkout", required=True)
    parser.add_argument("--mis", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    command = prepare(ns.checkout, ns.mis, args)
    os.chdir(ns.checkout)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(ns.checkout).resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
