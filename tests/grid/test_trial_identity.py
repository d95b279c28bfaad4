"""A trial id covers what decides its numbers: the pool's definition (not only its name), so a
``pool_catalog:`` that redefines a pool or an edited ``sim_profile`` gives new ids, while a
scheduling field (capacity) keeps them; a workdir recorded under the older id scheme is refused
with the one fix (``scheduler/_identity.check_scheme``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.exceptions import UserError
from orchestrator.grid import expand, load_grid
from orchestrator.pools import load_catalog
from orchestrator.scheduler._identity import IDENTITY, check_identity
from orchestrator.store import workspace

GRID = """\
name: ident-pool
recipe: {recipe}
backend: {backend}
steps: 4
seeds: [0, 1]
axes:
  correction.is_level: [none, token]
  pool: [{pool}]
{catalog}"""

H100 = ("  sim-h100:\n    kind: sim\n    accelerator: H100 (emulated)\n    capacity: {cap}\n"
        "    sim_profile: {{dtype: {dtype}, lm_head: bf16, kv_cache: fp8, reduction_order: chunked}}\n")


def _ids(tmp: Path, pool: str = "sim-h100", catalog: str | None = None,
         backend: str = "sim") -> list[str]:
    load_catalog.cache_clear()
    line = ""
    if catalog is not None:
        (tmp / "pools.yaml").write_text("pools:\n" + catalog)
        line = "pool_catalog: pools.yaml\n"
    path = tmp / "g.yaml"
    recipe = "verl/cpu_tiny" if backend == "verl" else "sim/grpo_tiny"
    path.write_text(GRID.format(pool=pool, catalog=line, backend=backend, recipe=recipe))
    return [t.trial_id for t in expand(load_grid(path))]


def _recorded(isolated: Path, stored: dict | None) -> tuple:
    """The test grid planned, and its workdir holding ``stored`` as identity.json (if given)."""
    path = isolated / "g.yaml"
    path.write_text(GRID.format(pool="sim-h100", catalog="", backend="sim",
                                recipe="sim/grpo_tiny"))
    grid = load_grid(path)
    trials = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    grid_dir.mkdir(parents=True)
    if stored is not None:
        (grid_dir / IDENTITY).write_text(json.dumps(stored))
    return path, grid, trials, grid_dir


def test_redefining_a_builtin_pool_gives_new_ids(tmp_path: Path) -> None:
    builtin = _ids(tmp_path)
    # The built-in definition spelt out again (another capacity: scheduling only): same ids.
    same = _ids(tmp_path, catalog=H100.format(cap=7, dtype="bf16"))
    assert same == builtin
    # An fp32 rollout under the same name: other numbers, so other ids.
    fp32 = _ids(tmp_path, catalog=H100.format(cap=2, dtype="fp32"))
    assert not set(fp32) & set(builtin) and len(set(fp32)) == 4


def test_a_cpu_pools_environment_and_world_size_are_in_the_id(tmp_path: Path) -> None:
    pytest.importorskip("verl")  # verl's plan-time checks need the verl extra
    base = ("  cpu-x:\n    kind: cpu\n    accelerator: CPU\n    capacity: {cap}\n"
            "    gpus_per_node: {gpus}\n    verl_env: {{OMP_NUM_THREADS: '{omp}'}}\n")
    a = _ids(tmp_path, "cpu-x", base.format(cap=1, gpus=1, omp=1), backend="verl")
    assert len(set(a)) == 4
    assert _ids(tmp_path, "cpu-x", base.format(cap=3, gpus=1, omp=1), backend="verl") == a
    assert not set(_ids(tmp_path, "cpu-x", base.format(cap=1, gpus=1, omp=2), backend="verl")) & set(a)
    assert not set(_ids(tmp_path, "cpu-x", base.format(cap=1, gpus=2, omp=1), backend="verl")) & set(a)


def test_a_workdir_of_the_older_id_scheme_is_refused_with_the_command(isolated: Path) -> None:
    # What rl-ablate wrote before ids covered the pool's definition: no id_scheme.
    old = {"fields": {}, "trials": ["t000000000001"], "schema_version": 1}
    path, grid, trials, grid_dir = _recorded(isolated, old)
    for extend in (False, True):
        with pytest.raises(UserError) as info:
            check_identity(grid, grid_dir, trials, extend=extend)
        msg = str(info.value)
        assert "\n" not in msg and "id scheme 1" in msg
        assert f"fix: run it again under a new name: `ablate submit {path} --name ident-pool-v2`" in msg
    assert json.loads((grid_dir / IDENTITY).read_text()) == old  # nothing written
    # A grid recorded by this version passes (and records its scheme).
    (grid_dir / IDENTITY).unlink()
    assert check_identity(grid, grid_dir, trials) is None
    assert json.loads((grid_dir / IDENTITY).read_text())["id_scheme"] == 2
    assert check_identity(grid, grid_dir, trials) is None


def test_trials_without_identity_json_tell_their_scheme_by_their_specs(isolated: Path) -> None:
    """Trials run by `ablate run-trial` (no identity.json): specs of this version carry their
    config id, older ones do not."""
    from orchestrator.scheduler._identity import check_scheme
    from orchestrator.store import TrialPaths, records

    path = isolated / "g.yaml"
    path.write_text(GRID.format(pool="sim-h100", catalog="", backend="sim",
                                recipe="sim/grpo_tiny"))
    grid = load_grid(path)
    (t, *_) = expand(grid)
    grid_dir = workspace.grid_dir(grid.name)
    paths = TrialPaths(grid_dir, t.trial_id)
    paths.root.mkdir(parents=True)
    records.save_spec(paths, t)
    check_scheme(grid, grid_dir)  # this version's spec: passes
    data = json.loads(paths.spec.read_text())
    del data["config"]
    paths.spec.write_text(json.dumps(data))
    with pytest.raises(UserError, match="id scheme 1"):
        check_scheme(grid, grid_dir)


@pytest.mark.parametrize("scheme", ["two", [2], 0, -1, 2.5, True])
def test_a_garbled_id_scheme_is_one_line_naming_the_file(isolated: Path, scheme: object) -> None:
    _, grid, trials, grid_dir = _recorded(isolated, None)
    stored = {"fields": {}, "trials": [t.trial_id for t in trials], "id_scheme": scheme}
    (grid_dir / IDENTITY).write_text(json.dumps(stored))
    with pytest.raises(UserError) as info:
        check_identity(grid, grid_dir, trials)
    msg = str(info.value)
    assert "\n" not in msg and str(grid_dir / IDENTITY) in msg and "id_scheme is" in msg
    assert "fix:" in msg
    assert json.loads((grid_dir / IDENTITY).read_text()) == stored  # nothing written


def test_a_workdir_of_a_newer_id_scheme_asks_for_an_upgrade(isolated: Path) -> None:
    from orchestrator.trial import ID_SCHEME

    stored = {"fields": {}, "trials": [], "id_scheme": ID_SCHEME + 1}
    _, grid, trials, grid_dir = _recorded(isolated, stored)
    with pytest.raises(UserError) as info:
        check_identity(grid, grid_dir, trials)
    msg = str(info.value)
    assert "\n" not in msg and "newer rl-ablate" in msg and "older" not in msg
    assert "fix: upgrade rl-ablate" in msg


def test_the_committed_quickstart_ids_are_what_the_grid_expands_to() -> None:
    """A trial id covers what decides its numbers and nothing else: moving code between
    packages (trainers apart from launchers, stats/, cli/) changed no id, so the committed
    results still name the trials ``grids/quickstart.yaml`` expands to."""
    import csv

    repo = Path(__file__).resolve().parents[2]
    load_catalog.cache_clear()
    expanded = sorted(t.trial_id for t in expand(load_grid(repo / "grids" / "quickstart.yaml")))
    with open(repo / "results" / "quickstart" / "trials.csv", newline="") as fh:
        committed = sorted(row["trial_id"] for row in csv.DictReader(fh))
    assert expanded == committed and len(expanded) == 12
    assert "tba779ec3bd95" in expanded  # the README's collapse


def test_a_vocabulary_key_added_later_changes_no_id_at_its_default() -> None:
    """Keys a section gained after id scheme 2 (``recipes.LATE_KEYS``) are hashed only when set:
    the loader fills every default into the composed recipe, so otherwise each new key would
    rename every trial ever run; set, it is part of the id as any key is."""
    from orchestrator import recipes

    base = {"learner": {"loss": None, "precision": None}, "train": {"lr": 0.001}}
    late = {"learner": {**base["learner"], **{k: None for k in recipes.LATE_KEYS["learner"]}},
            "train": base["train"]}
    assert recipes.digest(late) == recipes.digest(base)
    set_one = {"learner": {**late["learner"], "clip_ratio_c": 20.0}, "train": base["train"]}
    assert recipes.digest(set_one) != recipes.digest(base)
