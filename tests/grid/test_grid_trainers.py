"""One grid file, either trainer: ``recipe:`` given per trainer takes the backend's, and an
exclude rule's ``trainer:`` drops only that trainer's trials (``grids/seed_study.yaml`` runs on
verl or Miles by its ``backend:`` line), while every verl trial keeps its id."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.grid import expand, load_grid

REPO = Path(__file__).resolve().parents[2]
SEED_STUDY = REPO / "grids" / "seed_study.yaml"


def test_seed_study_on_either_trainer_by_its_backend_line() -> None:
    verl = load_grid(SEED_STUDY)
    miles = load_grid(SEED_STUDY, backend="miles")
    assert (verl.spec.recipe, miles.spec.recipe) == ("verl/qwen3_4b_dapo", "miles/qwen3_4b_dapo")
    verl_trials, miles_trials = expand(verl), expand(miles)
    assert (len(verl_trials), len(miles_trials)) == (209, 187)
    # The verl trials are the ones the file gave before it named a Miles recipe and rules.
    pinned = json.loads((REPO / "tests" / "data" / "grid_ids.json").read_text())
    assert [t.trial_id for t in verl_trials] == pinned["grids/seed_study.yaml"]
    # What Miles cannot express is dropped by its own rules: RS without IS weights, and its
    # masked arms that need its MIS function as renormalized.
    cells = {tuple(sorted(t.axis_values.items())) for t in miles_trials}
    assert not [c for c in cells if dict(c)["correction.is_level"] == "none"
                and dict(c)["rs"] != "off"]
    masked = {(d["correction.is_level"], d["correction.batch_norm"], d["correction.denominator"])
              for d in map(dict, cells) if d["correction.is_mode"] == "mask"}
    assert masked == {("token", "false", "original"), ("token", "true", "renormalized"),
                      ("sequence", "false", "renormalized"), ("sequence", "true", "renormalized")}


def test_the_miles_rules_change_no_verl_trial(tmp_path: Path) -> None:
    raw = yaml.safe_load(SEED_STUDY.read_text())
    raw["recipe"] = raw["recipe"]["verl"]
    raw["exclude"] = [r for r in raw["exclude"] if r.get("trainer") != "miles"]
    plain = tmp_path / "seed_study.yaml"
    plain.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert ([t.trial_id for t in expand(load_grid(plain))]
            == [t.trial_id for t in expand(load_grid(SEED_STUDY))])


def test_a_rule_of_another_trainer_matches_nothing_without_a_pool_axis(tmp_path: Path) -> None:
    grid = tmp_path / "g.yaml"
    text = ("name: g\nrecipe: sim/grpo_tiny\nsteps: 5\npool: sim-h100\n"
            "axes:\n  correction.is_level: [none, token]\n"
            "exclude:\n  - {trainer: TRAINER, correction.is_level: token}\n")
    grid.write_text(text.replace("TRAINER", "verl"))
    assert len(expand(load_grid(grid))) == 2
    grid.write_text(text.replace("TRAINER", "[sim, miles]"))
    assert [t.axis_values["correction.is_level"] for t in expand(load_grid(grid))] == ["none"]
