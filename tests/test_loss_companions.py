"""Each ``learner.loss`` runs at the settings of verl's own example for it (issue 36 item 2).

The companions (``learner.LOSS_COMPANIONS``) are added at expansion as the trial's ``learner.*``
overrides unless the grid sets the key itself, so ``plan --show-overrides`` shows them, the trial
records them and its id covers them; the simulator's losses read them. The verl facts behind the
table are read from the installed verl (the example scripts are not in the pip package; their
values are pinned in ``learner.py`` with their file and line).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator import recipes
from orchestrator.exceptions import UserError
from orchestrator.grid import _expansion, expand, load_grid
from orchestrator.learner import LOSS_COMPANIONS, LOSS_READS, LearnerSpec
from orchestrator.pools import load_catalog
from orchestrator.sim import loss_math

GRID = """\
name: companions
recipe: {recipe}
backend: {backend}
steps: 4
seeds: [0]
pool: {pool}
axes:
  learner.loss: [{losses}]
overrides: {overrides}
"""


ALL = "vanilla, gspo, cispo, sapo, geo_mean, dppo_tv, dppo_kl"


def _grid(tmp: Path, overrides: str = "{}", backend: str = "sim", losses: str = ALL,
          gpu: bool = False):
    load_catalog.cache_clear()
    path = tmp / "g.yaml"
    recipe, pool = ("sim/grpo_tiny", "sim-a100") if backend == "sim" else ("verl/cpu_tiny", "cpu-fp32")
    if gpu:  # a recipe with verl's loss keys (recipes/verl/_base.yaml)
        recipe, pool = "verl/qwen3_4b_dapo", "h100"
    path.write_text(GRID.format(overrides=overrides, backend=backend, recipe=recipe, pool=pool,
                                losses=losses))
    return load_grid(path)


def _by_loss(trials) -> dict[str, object]:
    return {t.override_map["learner.loss"]: t for t in trials}


def test_each_loss_gets_its_companions_and_only_those_ids_change(tmp_path, monkeypatch) -> None:
    new = _by_loss(expand(_grid(tmp_path)))
    for loss, trial in new.items():
        got = {k.split(".", 1)[1]: v for k, v in trial.override_map.items()
               if k.startswith("learner.") and k != "learner.loss"}
        assert got == LOSS_COMPANIONS.get(loss, {}), loss
    assert new["gspo"].override_map["learner.clip_ratio_low"] == 3e-4
    assert new["gspo"].override_map["learner.loss_agg_mode"] == "seq-mean-token-mean"
    assert new["cispo"].override_map["learner.clip_ratio_low"] == 10.0
    assert new["dppo_tv"].override_map["learner.clip_ratio_c"] == 20.0
    monkeypatch.setattr(_expansion, "loss_companions", lambda loss, given: {})  # main before
    old = _by_loss(expand(_grid(tmp_path)))
    for loss in new:
        same = new[loss].trial_id == old[loss].trial_id
        assert same == (loss not in LOSS_COMPANIONS), loss  # vanilla and sapo keep their ids


def test_an_explicit_key_overrides_its_companion(tmp_path) -> None:
    trials = _by_loss(expand(_grid(tmp_path, "{learner.clip_ratio_high: 0.5}", losses="gspo, cispo")))
    assert trials["gspo"].override_map["learner.clip_ratio_high"] == 0.5
    assert trials["gspo"].override_map["learner.clip_ratio_low"] == 3e-4
    # the simulator's own clip range, set by the grid, keeps both clip companions out
    trials = _by_loss(expand(_grid(tmp_path, "{train.clip_eps: 0.1}")))
    over = trials["gspo"].override_map
    assert "learner.clip_ratio_low" not in over and "learner.clip_ratio_high" not in over
    assert over["learner.loss_agg_mode"] == "seq-mean-token-mean"


def test_a_setting_the_loss_does_not_read_is_refused(tmp_path) -> None:
    with pytest.raises(UserError, match="learner.clip_ratio_c has no effect on learner.loss: gspo"):
        expand(_grid(tmp_path, "{learner.clip_ratio_c: 5.0}", losses="gspo"))
    with pytest.raises(ValueError, match="needs learner.loss"):
        LearnerSpec(clip_ratio_low=0.1)


def test_verl_runs_the_companions_in_place_of_the_recipes_ppo_values(tmp_path) -> None:
    """A gspo trial's command line sets the companions, after the recipe's values (the learner's
    keys come last, one value per key: recipes/verl/_base.yaml's PPO 0.2/0.28 are replaced)."""
    pytest.importorskip("omegaconf")
    from orchestrator.verl.trainer import VerlTrainer

    grid = _grid(tmp_path, backend="verl", losses="vanilla, gspo")
    trials = _by_loss(expand(grid))
    pool = load_catalog().get("cpu-fp32")
    shown = {}
    for loss, trial in trials.items():
        items = VerlTrainer.job(grid.trial_config(trial).updated(pool=pool)).describe(trial)
        shown[loss] = {i.split("=", 1)[0]: i.split("=", 1)[1].strip("'") for i in items
                       if i.startswith("actor_rollout_ref.actor.") and "clip_ratio" in i
                       or "loss_agg_mode" in i}
    actor = "actor_rollout_ref.actor"
    assert shown["gspo"] == {f"{actor}.clip_ratio_low": "0.0003", f"{actor}.clip_ratio_high": "0.0004",
                             f"{actor}.loss_agg_mode": "seq-mean-token-mean"}
    assert not set(shown["vanilla"].values()) & set(shown["gspo"].values())  # the recipe's


def test_a_grid_setting_verls_key_keeps_it_and_both_spellings_are_refused(tmp_path) -> None:
    pytest.importorskip("omegaconf")
    key = "actor_rollout_ref.actor.clip_ratio_high"
    over = _by_loss(expand(_grid(tmp_path, f"{{{key}: 0.5}}", backend="verl", losses="gspo",
                                 gpu=True)))
    assert "learner.clip_ratio_high" not in over["gspo"].override_map
    assert over["gspo"].override_map["learner.clip_ratio_low"] == 3e-4
    with pytest.raises(UserError, match="both set the loss's clip_ratio_high"):
        expand(_grid(tmp_path, f"{{{key}: 0.5, learner.clip_ratio_high: 0.4}}", backend="verl",
                     losses="gspo", gpu=True))


def test_the_simulator_trains_with_the_companions(tmp_path) -> None:
    from orchestrator.sim.config import build_setup
    from orchestrator.sim.model import ModelConfig
    from orchestrator.sim.task import Task
    from orchestrator.sim.trainer import GRPOTrainer, TrainConfig

    grid = _grid(tmp_path)
    trial = _by_loss(expand(grid))["gspo"]
    config = recipes.apply_overrides(grid.recipe_config, trial.override_map)
    setup = build_setup(config, load_catalog().get("sim-a100"))
    task = Task(**setup.task)
    tr = GRPOTrainer(ModelConfig(vocab=task.vocab, max_len=task.seq_len, **setup.model), task,
                     TrainConfig(**setup.train), setup.correction, setup.numerics, 0, setup.learner)
    assert tr.loss_params == loss_math.LossParams(3e-4, 4e-4, 3.0, "seq-mean-token-mean")


VERL = Path(pytest.importorskip("verl").__file__).parent


def _line(rel: str, pattern: str) -> list[int]:
    text = (VERL / rel).read_text().splitlines()
    return [i for i, line in enumerate(text, 1) if re.search(pattern, line)]


def test_the_verl_facts_behind_the_table() -> None:
    """learner.py cites these lines: ActorConfig's clip_ratio_c default 3.0 (which verl's DPPO
    reads, as the key always exists) against core_algos' own fallback 20 for DPPO."""
    from verl.workers.config.actor import ActorConfig

    assert ActorConfig.__dataclass_fields__["clip_ratio_c"].default == 3.0
    assert _line("workers/config/actor.py", r"clip_ratio_c: float = 3\.0") == [163]
    assert _line("trainer/config/actor/actor.yaml", r"^clip_ratio_c: 3\.0") == [83]
    core = "trainer/ppo/core_algos.py"
    assert _line(core, r'clip_ratio_c = config\.get\("clip_ratio_c", 20\.0\)') == [1427, 1508]
    assert _line(core, r"clip_ratio_low = config\.clip_ratio_low if") == [1321, 1575, 1960, 2065]
    assert _line(core, r'loss_agg_mode="seq-mean-token-mean"') == [1689]  # sapo's own
    assert _line(core, r"pg_loss = torch\.mean\(pg_losses\)") == [2000]  # geo_mean's own
    assert LOSS_READS["sapo"] == frozenset() and "loss_agg_mode" not in LOSS_READS["geo_mean"]


def test_a_derived_trial_with_another_loss_gets_that_losss_companions(tmp_path) -> None:
    from orchestrator.grid import derive_trial

    grid = _grid(tmp_path, losses="gspo")
    parent = expand(grid)[0]
    child = derive_trial(grid, parent, {"learner.loss": "cispo"}, from_step=2)
    got = {k: v for k, v in child.override_map.items() if k.startswith("learner.")}
    assert got == {"learner.loss": "cispo", "learner.clip_ratio_low": 10.0,
                   "learner.clip_ratio_high": 0.2}
