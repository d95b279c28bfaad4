"""Bad input for verl on cpu pools: one line naming the file, key and fix, exit 2, nothing
started (fast: no verl job starts). A model too large for the pool's memory, verl missing on
this machine, a checkpoint whose world size the target pool does not give."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import cliproc
import pytest

from orchestrator.grid import expand, load_grid
from orchestrator.pools import load_catalog
from orchestrator.verl.memory import (
    JOB_BASE_GB,
    PER_RANK_GB,
    check_memory,
    estimate_gb,
    model_shape,
)
from orchestrator.verl.topology import portability

REPO = Path(__file__).resolve().parents[2]
POOLS = load_catalog().pools


def _ablate(args: list[str], tmp: Path, *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter; ``prelude`` runs first (e.g. to make an import fail)."""
    code = f"{prelude}\nimport sys\nfrom orchestrator.cli import main\nsys.exit(main({args!r}))"
    with cliproc.ablate_env(tmp) as env:
        return subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=120, check=False)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _grid(tmp: Path, body: str) -> Path:
    path = tmp / "g.yaml"
    path.write_text(textwrap.dedent(body))
    return path


# --------------------------------------------------------------------------- model too large


BIG = """\
    name: big-on-cpu
    recipe: verl/qwen3_4b_dapo
    backend: verl
    steps: 2
    pool: cpu-fp32
    """


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_a_model_too_large_for_a_cpu_pool_is_refused_before_anything_starts(
        tmp_path: Path, command: str) -> None:
    path = _grid(tmp_path, BIG)
    line = _one_line(_ablate([command, str(path)], tmp_path))
    assert line.startswith(f"error: {path}:5: pool: "), line  # the file, the line of `pool:`
    assert "actor_rollout_ref.model.path" in line and "4e+09 parameters" in line, line
    assert "more than this machine's RAM" in line and "fix: a smaller model" in line, line
    assert not (tmp_path / ".ablate").exists()  # nothing started, nothing recorded


def test_the_estimate_matches_the_measured_tiny_jobs_and_the_tiny_recipe_passes() -> None:
    """The fixed cost is the measured peak RSS of the tiny recipe's jobs (README: 5.76 GB on 1
    rank, 6.96 GB on 2): the model-dependent part of the estimate is negligible there."""
    grid = load_grid(REPO / "grids" / "verl_cpu.yaml")
    config = grid.trial_config(expand(grid, force=True)[0])
    shape = model_shape(config)
    assert shape is not None and 5e4 < shape.params < 1e5 and "assets" in shape.source
    one, two = estimate_gb(config, POOLS["cpu-fp32"], shape), estimate_gb(config, POOLS["cpu"], shape)
    assert 5.76 * 0.95 < one < 5.76 * 1.1 and 6.96 * 0.95 < two < 6.96 * 1.1, (one, two)
    assert two - one == pytest.approx(PER_RANK_GB, abs=0.05) and one > JOB_BASE_GB
    for pool in ("cpu-fp32", "cpu-bf16", "cpu"):
        assert check_memory(config, POOLS[pool]) is None


def test_a_local_model_config_and_a_pools_declared_memory_are_used(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000}))
    config = {"actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"n": 4}},
              "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 64}}
    shape = model_shape(config)
    assert shape is not None and shape.source == f"config.json of {model}"
    assert 1.2e9 < shape.params < 1.6e9  # 24 x (2 x 2048^2 + 2 x 2048 x 512 + 3 x 2048 x 8192) + 2 x 32000 x 2048
    small = POOLS["cpu-fp32"].model_copy(update={"memory_per_node": "16Gi"})
    problem = check_memory(config, small)
    assert problem is not None and "memory_per_node 16Gi (16.0 GB)" in problem, problem
    roomy = POOLS["cpu-fp32"].model_copy(update={"memory_per_node": "1Ti"})
    assert check_memory(config, roomy) is None
    assert check_memory(config, POOLS["h100"]) is None  # GPU memory is not this check's
    unknown = {"actor_rollout_ref": {"model": {"path": "some/model-without-a-size"}}}
    assert model_shape(unknown) is None and check_memory(unknown, small) is None


# --------------------------------------------------------------------------- verl missing


NO_VERL = "import sys\nsys.modules['verl'] = None  # `import verl` now fails, as if not installed"


@pytest.mark.parametrize("command", ["submit", "run-trial"])
def test_verl_missing_is_one_line_naming_the_install(tmp_path: Path, command: str) -> None:
    grid = REPO / "grids" / "verl_cpu.yaml"
    args = [command, str(grid)]
    if command == "run-trial":
        args += ["--trial", expand(load_grid(grid), force=True)[0].trial_id]
    line = _one_line(_ablate(args, tmp_path, prelude=NO_VERL))
    assert f"{grid}: pool: " in line and "cpu-fp32" in line, line
    assert "verl cannot be imported" in line and "pip install -e '.[verl]'" in line, line
    assert not (tmp_path / ".ablate").exists()  # no grid directory, lease, MLflow store or Ray


def test_verl_present_passes_the_same_check() -> None:
    pytest.importorskip("verl")
    pytest.importorskip("transfer_queue")
    from orchestrator.verl.trainer import VerlTrainer

    VerlTrainer.require([POOLS["cpu-fp32"], POOLS["cpu"], POOLS["h100"]])


# --------------------------------------------------------------------------- world size


def test_world_size_refusal_on_a_cpu_pool_names_the_pools_that_fit() -> None:
    """A 1-rank checkpoint on the 2-rank cpu pool: the way out is a cpu pool with 1 rank (cpu
    pools are one node, so trainer.nnodes is no fix)."""
    ok, why = portability(1, POOLS["cpu"], {"trainer": {"nnodes": 1}}, others=POOLS.values())
    assert not ok
    assert "the checkpoint has 1, pool 'cpu' gives 2" in why, why
    assert "fix: resume on a cpu pool with 1 rank(s): cpu-fp32, cpu-bf16" in why, why
    assert "trainer.nnodes" not in why and "model_merger" in why and "\n" not in why
    ok, why = portability(2, POOLS["cpu-bf16"], {"trainer": {"nnodes": 1}}, others=POOLS.values())
    assert not ok and "with 2 rank(s): cpu;" in why, why


def test_world_size_refusal_on_a_gpu_pool_names_gpu_pools_of_that_size() -> None:
    ok, why = portability(16, POOLS["h100"], {"trainer": {"nnodes": 1}}, others=POOLS.values())
    assert not ok and "trainer.nnodes" in why, why
    assert "cpu" not in why.split("fix:")[1].split(";")[0], why  # gpu pools only
