"""``eval: {reference: ...}`` at plan: part of a trial's id only when set (the committed
quickstart ids stay), refused with one line where it cannot run or is spelt wrong, and never
settable per trial; ``engine``'s evaluation pool and engine settings checked as a trial's."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from orchestrator import evaluation
from orchestrator.cli import main
from orchestrator.exceptions import GridError
from orchestrator.grid import expand, load_grid
from orchestrator.schema import EvalSpec

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "grids" / "quickstart.yaml"


def _with(tmp: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def test_the_schema_and_the_vocabulary_name_the_same_targets() -> None:
    assert EvalSpec.model_fields["reference"].annotation == (
        __import__("typing").Literal[evaluation.REFERENCE_TARGETS] | None)


def test_quickstart_ids_are_the_committed_ones_and_the_key_gives_new_ones(tmp_path: Path) -> None:
    """The quickstart scores with the reference (its committed ids are those); the same grid
    without the key has the ids it had before the key existed (``t9ad24f93ff05``: the README's
    collapse until then), so grids that never set it keep theirs."""
    with open(REPO / "results" / "quickstart" / "trials.csv", newline="") as f:
        committed = {row["trial_id"] for row in csv.DictReader(f)}
    text = QUICKSTART.read_text()
    assert "eval: {reference: trainer}\n" in text
    grid = load_grid(QUICKSTART)
    ref = expand(grid)
    assert {t.trial_id for t in ref} == committed
    plain = expand(load_grid(_with(tmp_path, text.replace("eval: {reference: trainer}\n", ""),
                                   "quickstart.yaml")))
    assert len(ref) == len(plain) and not {t.trial_id for t in plain} & committed
    assert "t9ad24f93ff05" in {t.trial_id for t in plain}
    for a, b in zip(plain, ref):  # the same cells, each with the one extra override
        assert a.axes == b.axes and a.seed == b.seed
        assert dict(b.overrides) == {**dict(a.overrides), evaluation.OVERRIDE_KEY: "trainer"}
    assert evaluation.reference_of(grid.trial_config(ref[0])) == "trainer"


BASE = "name: g\nrecipe: sim/grpo_tiny\nsteps: 4\npool: sim-h100\n"


@pytest.mark.parametrize(("extra", "match"), [
    ("eval: {reference: fp32}\n", r"eval\.reference: 'fp32' is not an allowed value; allowed: trainer"),
    ("eval: {referense: trainer}\n", r"eval\.referense.*reference"),
    ("overrides: {eval.reference: trainer}\n",
     r"overrides\.eval\.reference.*fix: write 'eval: \{reference: trainer\}'"),
    ("axes:\n  b:\n    x: {eval.reference: trainer}\n    y: {}\n", r"axes\.b\.x\.eval\.reference"),
])
def test_bad_reference_settings_are_one_line_at_plan(tmp_path: Path, extra: str, match: str) -> None:
    with pytest.raises(GridError, match=match) as info:
        load_grid(_with(tmp_path, BASE + extra))
    assert "\n" not in str(info.value)


def test_verl_takes_the_reference_on_cpu_pools_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verl's reference is an fp32 forward of the checkpoints of the in-code task (the cpu pools,
    ``verl/cpu/reference.py``): part of the ids there; a gpu pool or a recipe without
    ``assets:`` is one line at plan, exit 2."""
    head = "name: v\nrecipe: verl/cpu_tiny\nbackend: verl\nsteps: 3\n"
    ok = load_grid(_with(tmp_path, head + "pool: cpu-fp32\neval: {reference: trainer}\n"))
    (trial,) = expand(ok)
    assert dict(trial.overrides)[evaluation.OVERRIDE_KEY] == "trainer"
    gpu = _with(tmp_path, head + "pool: h100\neval: {reference: trainer}\n", "gpu.yaml")
    with pytest.raises(GridError, match=r"eval\.reference: trainer on the verl backend runs on "
                       r"the cpu pools only \(pool h100 is a gpu pool.*fix: use 'reference: "
                       r"engine' with an evaluation pool"):
        load_grid(gpu)
    assert main(["plan", str(gpu)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu pools only" in err
    bare = (REPO / "recipes" / "verl" / "cpu_tiny.yaml").read_text().split("\nalgorithm:", 1)[1]
    recipes = tmp_path / "recipes" / "verl"
    recipes.mkdir(parents=True)
    (recipes / "no_assets.yaml").write_text("algorithm:" + bare)
    text = ("name: v\nrecipe: verl/no_assets\n"
            "backend: verl\nsteps: 3\npool: cpu-fp32\neval: {reference: trainer}\n")
    with pytest.raises(GridError, match=r"in-code task of the recipe's 'assets:' section"):
        expand(load_grid(_with(tmp_path, text, "bare.yaml")))


def test_final_reward_ref_is_a_target_only_with_a_reference(tmp_path: Path) -> None:
    text = (BASE.replace("pool: sim-h100\n", "") + "axes:\n  pool: [sim-h100, sim-a100]\n"
            "compare: {axis: pool, baseline: sim-h100, target: final_reward_ref, paired: true}\n")
    with pytest.raises(GridError, match=r"compare\.target: final_reward_ref is not recorded by "
                       r"this grid.*fix: add 'eval: \{reference: trainer\}'"):
        load_grid(_with(tmp_path, text))
    assert len(expand(load_grid(_with(tmp_path, text + "eval: {reference: trainer}\n")))) == 2
    adaptive = BASE + "seeds: {adaptive: {target: final_reward_ref, min: 2, max: 4}}\n"
    with pytest.raises(GridError, match=r"seeds\.adaptive\.target: final_reward_ref"):
        load_grid(_with(tmp_path, adaptive))
    load_grid(_with(tmp_path, adaptive + "eval: {reference: trainer}\n"))


VERL = "name: v\nrecipe: verl/cpu_tiny\nbackend: verl\nsteps: 3\npool: cpu-bf16\n"


def test_the_engine_reference_names_its_pool_and_engine_in_every_trial_id(tmp_path: Path) -> None:
    """``reference: engine`` (verl's validation by one engine setting on one pool, a job of its
    own): the pool and the settings are part of every trial's id, so another evaluation pool
    or engine is another grid; the recipe needs no in-code task (verl's own validation data and
    reward), and the trial's pool may be a gpu pool (the job runs on the evaluation pool)."""
    ids = {}
    for label, ev in [("cpu", "{reference: engine, pool: cpu-fp32}"),
                      ("cpu-eng", "{reference: engine, pool: cpu-fp32, rollout: {engine: cpu}}"),
                      ("other", "{reference: engine, pool: cpu-bf16}")]:
        (trial,) = expand(load_grid(_with(tmp_path, VERL + f"eval: {ev}\n", f"{label}.yaml")))
        ids[label] = trial.trial_id
        over = dict(trial.overrides)
        assert over[evaluation.OVERRIDE_KEY] == "engine"
        assert over[evaluation.POOL_KEY] == ("cpu-bf16" if label == "other" else "cpu-fp32")
    assert len(set(ids.values())) == 3
    (trial,) = expand(load_grid(_with(tmp_path, VERL + "eval: {reference: engine, pool: cpu-fp32, "
                                      "rollout: {engine: cpu}}\n", "again.yaml")))
    assert trial.trial_id == ids["cpu-eng"]
    grid = load_grid(_with(tmp_path, VERL.replace("cpu-bf16", "h100")
                           + "eval: {reference: engine, pool: h20}\n", "gpu.yaml"))
    assert evaluation.reference_job(grid.base_config) == ("h20", {})
    assert evaluation.reference_of(grid.base_config) == "engine"


@pytest.mark.parametrize(("ev", "match"), [
    ("{reference: engine}", (r"eval\.reference: the engine reference scores every arm's checkpoints "
     r"on one named pool, and eval\.pool is not set; fix: add 'pool: <a cpu or gpu pool>'")),
    ("{reference: trainer, pool: cpu-fp32}", (r"eval\.pool: .*the grid's reference is trainer; "
     r"fix: set 'reference: engine', or drop eval\.pool")),
    ("{rollout: {engine: cpu}}", r"eval\.rollout: .*the grid's reference is not set"),
    ("{reference: engine, pool: nosuch}", r"eval\.pool: unknown pool 'nosuch'; allowed: .*cpu-fp32"),
    ("{reference: engine, pool: sim-h100}", (r"eval\.pool: eval\.pool sim-h100 is a sim pool.*"
     r"fix: name a gpu or cpu pool")),
    ("{reference: engine, pool: cpu-fp32, rollout: {dtype: fp9}}",
     r"eval\.rollout\.dtype: 'fp9' is not valid for rollout\.dtype"),
    ("{reference: engine, pool: cpu-fp32, rollout: {enigne: cpu}}",
     r"eval\.rollout\.enigne: unknown key 'rollout\.enigne'.*did you mean 'rollout\.engine'"),
    ("{reference: engine, pool: cpu-fp32, rollout: {engine: sglang}}",
     r"eval\.rollout: on evaluation pool cpu-fp32: rollout\.engine: sglang is a GPU engine"),
    ("{reference: engine, pool: h100}", (r"eval\.pool: the checkpoints of pool cpu-bf16 hold 1 FSDP "
     r"shard\(s\), and evaluation pool h100 runs 8 rank\(s\).*fix: an evaluation pool of 1 GPU")),
])
def test_bad_engine_reference_settings_are_one_line_at_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], ev: str, match: str) -> None:
    path = _with(tmp_path, VERL + f"eval: {ev}\n")
    with pytest.raises(GridError, match=match) as info:
        load_grid(path)
    assert "\n" not in str(info.value)
    assert main(["plan", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_engine_reference_refuses_the_simulator_and_arms_with_their_own_model(
        tmp_path: Path) -> None:
    with pytest.raises(GridError, match=r"eval\.reference: engine is not a target here; fix: "
                       r"drop eval\.reference"):
        load_grid(_with(tmp_path, BASE + "eval: {reference: engine, pool: cpu-fp32}\n"))
    arms = VERL + ("axes:\n  m: {a: {assets.max_digits: 2}, b: {assets.max_digits: 3}}\n"
                   "eval: {reference: engine, pool: cpu-fp32}\n")
    with pytest.raises(GridError, match=r"assets\.max_digits is set per arm, and the engine "
                       r"reference scores every arm with the grid's one model"):
        load_grid(_with(tmp_path, arms, "arms.yaml"))
    for key in ("eval.pool", "eval.rollout"):
        with pytest.raises(GridError, match=rf"overrides\.{key}: {key} is set by the grid key"):
            load_grid(_with(tmp_path, VERL + f"overrides: {{{key}: x}}\n", "o.yaml"))
