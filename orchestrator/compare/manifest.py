"""``MANIFEST.json`` of a generated results directory: what produced its numbers.

Every directory the report writers generate (``results/<grid>/`` from ``ablate compare``,
``results/findings/`` from ``benchmarks/findings.py``) gets one, recording

- ``inputs``: a content hash over everything that decides the numbers in it and nothing else: the
  grid file, the composed recipe (with the shared vocabularies' defaults), the pool catalog, the
  simulator's source files and the modules that map grid keys onto it, the collapse rules, and
  for the findings report the scripts that analyse it. Documentation, the CLI and the table
  layout are left out, so a README edit or a new column does not make committed numbers stale;
- ``code``: the package version and git commit (with a dirty flag) of the run that wrote it;
- ``numerics``: the numeric environments the trials ran under (``orchestrator/sim/numerics.py``:
  pinned or not, CPU, instruction set, torch/MKL/oneDNN versions), each with its trial count;
- ``regenerate``: the command that writes the directory again.

``stale(directory)`` recomputes the hash with the current code; a test does that for every
committed ``results/`` directory and prints ``regenerate`` when they differ.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import GridError
from orchestrator.grid import expand, load_grid
from orchestrator.sim.numerics import DECIDING, fingerprint

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec

NAME = "MANIFEST.json"
SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parents[2]
# Source files, relative to the repository, whose content decides a grid's numbers. Every
# grid: the correction and engine vocabularies (defaults and validation), the learner's, and the
# verdict rules (verdicts, collapse steps and early stops are part of every table). A simulator
# pool's trials: the simulator's training path (not its calibration or command-line modules),
# the backend adapter that builds its config and the pinned numerics. A cpu or gpu pool's (real
# verl jobs): the verl backend, which builds each job's overrides, environment and engine
# settings and reads its metrics, with the CPU platform, plugin and rollout engine it loads.
COMMON_SOURCES = ("orchestrator/corrections.py", "orchestrator/engine.py", "orchestrator/learner.py",
                  "orchestrator/verdict/_value.py", "orchestrator/verdict/_rules.py",
                  "orchestrator/verdict/_detectors.py", "orchestrator/verdict/_engine.py")
KIND_SOURCES: dict[str, tuple[str, ...]] = {
    "sim": ("orchestrator/sim/config.py", "orchestrator/sim/correction_math.py",
            "orchestrator/sim/model.py", "orchestrator/sim/profile.py", "orchestrator/sim/rollout.py",
            "orchestrator/sim/task.py", "orchestrator/sim/trainer.py", "orchestrator/sim/job.py",
            "orchestrator/sim/numerics.py", "orchestrator/sim/loss_math.py",
            "orchestrator/sim/precision.py"),
    "cpu": ("orchestrator/verl/**/*.py",),
}
KIND_SOURCES["gpu"] = KIND_SOURCES["cpu"]
# A grid scored by the reference evaluator (``eval: {reference: ...}``): its numbers on a
# simulator pool (verl's evaluator is under ``orchestrator/verl/`` already).
REFERENCE_SOURCES: dict[str, tuple[str, ...]] = {"sim": ("orchestrator/sim/reference.py",)}
NUMERIC_SOURCES = COMMON_SOURCES + KIND_SOURCES["sim"]  # a simulator grid's, the usual case
# The fields of a pool that decide a trial's numbers: its simulator profile, or for verl the
# overrides, environment and world size it runs with.
POOL_FIELDS = ("kind", "sim_profile", "verl_overrides", "verl_env", "gpus_per_node", "nodes")
CODE_DIRS = ("orchestrator", "recipes", "grids", "benchmarks")
# The numeric facts recorded per environment (``numerics.describe``), besides its fingerprint.
FACTS = ("reproducible", "why", "machine", "cpu", "cpu_flags", "levels", "aten_capability", "torch",
         "mkl", "onednn")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    # Line endings normalised: a checkout with CRLF line endings computes the same hash.
    return _sha256(path.read_bytes().replace(b"\r\n", b"\n"))


def source_files(patterns: Iterable[str] = NUMERIC_SOURCES, root: Path = REPO) -> list[Path]:
    """The files ``patterns`` (globs relative to ``root``) name, sorted; a pattern naming no file
    is an error, so a moved module cannot silently drop out of the hash."""
    out: set[Path] = set()
    for pattern in patterns:
        found = sorted(root.glob(pattern))
        if not found:
            raise FileNotFoundError(f"manifest source pattern {pattern!r} names no file under {root}")
        out.update(found)
    return sorted(out)


def _label(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (as given, else with links resolved), else its name: never
    an absolute path of this machine."""
    for p, r in ((path.absolute(), root.absolute()), (path.resolve(), root.resolve())):
        try:
            return p.relative_to(r).as_posix()
        except ValueError:
            continue
    return path.name


def grid_inputs(grid_file: str | Path, *, extra: Sequence[str] = (), grid_root: Path = REPO,
                code_root: Path = REPO, backend: str | None = None) -> dict[str, str]:
    """Label -> sha256 of everything that decides the numbers of ``grid_file``'s trials: the
    grid file (labelled relative to ``grid_root``), its composed recipe (as JSON, so Hydra's file
    layout does not matter), the pools its trials use, the sources that decide their numbers
    (:data:`COMMON_SOURCES` and :data:`KIND_SOURCES` of each pool's kind, with
    :data:`REFERENCE_SOURCES` where the grid scores with the reference evaluator) and ``extra``
    (globs relative to ``code_root``, the checkout or install the code runs from); ``backend``:
    another than the file's (``ablate submit --backend``)."""
    grid = load_grid(grid_file, backend=backend)
    inputs = {f"grid:{_label(Path(grid_file), grid_root)}": _file_digest(Path(grid_file)),
              f"recipe:{grid.spec.recipe}": _sha256(json.dumps(grid.recipe_config, sort_keys=True).encode())}
    # The numeric fields of the pools its trials use (a search may pick any), not the catalogue
    # files: a new pool elsewhere in the catalogue, or a pool's description, capacity or price,
    # changes no number.
    names = grid.pools.names() if grid.spec.search is not None else _used_pools(grid)
    sources = list(COMMON_SOURCES)
    for name in names:
        spec = grid.pools.get(name).model_dump(mode="json")
        numeric = {k: spec.get(k) for k in POOL_FIELDS}
        inputs[f"pool:{name}"] = _sha256(json.dumps(numeric, sort_keys=True).encode())
        kind_sources = KIND_SOURCES[spec["kind"]]
        if grid.spec.eval.reference is not None:
            kind_sources += REFERENCE_SOURCES.get(spec["kind"], ())
        sources += [s for s in kind_sources if s not in sources]
    for path in source_files((*sources, *extra), code_root):
        inputs[_label(path, code_root)] = _file_digest(path)
    return inputs


def _used_pools(grid: GridSpec) -> list[str]:
    """The pools of the grid's trials; where this machine cannot plan them (an engine's Python
    environment it lacks, say), every pool the grid names: the inputs of a committed result
    never depend on what is installed where it is checked."""
    try:
        return sorted({t.pool for t in expand(grid)})
    except GridError:
        named = {grid.spec.pool} if grid.spec.pool else set()
        for axis in grid.axes:
            if axis.kind == "pool":
                named.update(axis.labels)
        named.update(v for inc in grid.includes for k, v in inc if k == "pool")
        return sorted(named)


def combined(inputs: Mapping[str, str]) -> str:
    """One hash over the labelled digests (order-independent)."""
    return _sha256(json.dumps(dict(sorted(inputs.items())), sort_keys=True).encode())


def code_version(root: Path = REPO) -> dict[str, Any]:
    """Package version and, where this is a git checkout, its commit and whether its code or
    inputs (:data:`CODE_DIRS`) had uncommitted edits."""
    try:
        version = importlib.metadata.version("rl-ablate")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    out: dict[str, Any] = {"package": "rl-ablate", "version": version, "git_commit": None, "git_dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        # Edits to the code and inputs only: the results being written are edits too.
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                 "--", *CODE_DIRS], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    out.update(git_commit=commit or None, git_dirty=bool(status.strip()))
    return out


def numeric_environments(facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The distinct numeric environments among the trials' recorded facts (``numerics.*`` tags),
    each with its fingerprint and trial count; trials without facts are counted apart."""
    envs: dict[str, dict[str, Any]] = {}
    missing = 0
    for env in facts:
        if not env or not any(env.get(k) for k in DECIDING):
            missing += 1
            continue
        fp = str(env.get("fingerprint") or fingerprint(env))
        entry = envs.setdefault(fp, {"fingerprint": fp, "trials": 0,
                                     **{k: str(env.get(k, "")) for k in FACTS}})
        entry["trials"] += 1
    out = sorted(envs.values(), key=lambda e: -e["trials"])
    if missing:
        out.append({"fingerprint": None, "trials": missing, "why": "no numeric environment recorded"})
    return out


def build(inputs: Mapping[str, str], *, kind: str, regenerate: str, source: Mapping[str, Any],
          environments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest as a dict (``source``: what the hash is recomputed from, relative paths)."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "regenerate": regenerate,
            "inputs_sha256": combined(inputs), "inputs": dict(sorted(inputs.items())),
            "source": dict(source), "code": code_version(), "numerics": list(environments)}


def write(directory: Path, manifest: Mapping[str, Any]) -> Path:
    """Write ``MANIFEST.json`` atomically (temp file + rename)."""
    path = Path(directory) / NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def for_grid(grid_file: str | Path, out: Path, *, environments: Sequence[Mapping[str, Any]],
             evaluated: bool = False, backend: str | None = None) -> dict[str, Any]:
    """The manifest of ``ablate compare GRID --out OUT`` (paths as given from the current
    directory, which for the committed ``results/`` is the repository); ``evaluated``: its
    reference scores came from ``ablate evaluate``, which the command then runs too;
    ``backend``: the one the trials ran on, recorded (and hashed: its recipe, its pools) where
    ``ablate submit --backend`` gave another than the file's."""
    grid_label = _label(Path(grid_file), Path.cwd())
    out_label = _label(Path(out), Path.cwd())
    own = load_grid(grid_file)
    backend = None if backend in (None, own.backend) else backend
    regenerate = (f"ablate submit {grid_label}{f' --backend {backend}' if backend else ''} && "
                  + (f"ablate evaluate {grid_label} && " if evaluated else "")
                  + f"ablate compare {grid_label}"
                  + ("" if out_label == f"results/{own.name}" else f" --out {out_label}"))
    return build(grid_inputs(grid_file, grid_root=Path.cwd(), backend=backend), kind="compare",
                 regenerate=regenerate, environments=environments,
                 source={"grid": grid_label, **({"backend": backend} if backend else {})})


def for_script(grid_file: str | Path, scripts: Sequence[str], *, regenerate: str,
               environments: Sequence[Mapping[str, Any]], root: Path = REPO) -> dict[str, Any]:
    """The manifest of a directory a script writes from a grid's runs (``benchmarks/findings.py``):
    the grid's inputs plus the ``scripts`` (globs relative to ``root``) that run and analyse it."""
    return build(grid_inputs(grid_file, extra=scripts, grid_root=root, code_root=root), kind="script", regenerate=regenerate,
                 source={"grid": _label(Path(grid_file), root), "extra": list(scripts)},
                 environments=environments)


def current_inputs(manifest: Mapping[str, Any], root: Path = REPO) -> dict[str, str]:
    """What the inputs of ``manifest`` hash to with the files as they are now."""
    source = manifest.get("source") or {}
    return grid_inputs(root / source["grid"], extra=tuple(source.get("extra", ())), grid_root=root,
                       code_root=root, backend=source.get("backend"))


def stale(directory: Path, root: Path = REPO) -> str | None:
    """Why the committed ``directory`` no longer matches the code (None when it does)."""
    path = Path(directory) / NAME
    if not path.is_file():
        return (f"{_label(Path(directory), root)} has no {NAME}; regenerate it with the command that "
                "wrote it (`ablate submit GRID && ablate compare GRID` for results/<grid>/, the script "
                "its report names otherwise), which writes the manifest too")
    manifest = json.loads(path.read_text())
    now = current_inputs(manifest, root)
    if combined(now) == manifest.get("inputs_sha256"):
        return None
    before = manifest.get("inputs") or {}
    changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
    return (f"{_label(Path(directory), root)} was generated from other inputs than the current code "
            f"(changed: {', '.join(changed)}); regenerate with: {manifest.get('regenerate')}")
