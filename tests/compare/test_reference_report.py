"""``ablate compare`` with reference scores (``eval/reward_ref``): both numbers per cell and
trial, the cells where they disagree, the reference curves, ``target: final_reward_ref``; and
nothing of it for trials without reference scores."""
from __future__ import annotations

import csv
from pathlib import Path

from orchestrator import metrics as M
from orchestrator.compare._data import Segment, TrialResult
from orchestrator.compare._report import build_report
from orchestrator.schema import CompareDecl

# (own final, reference final) per seed: on sim-a100 the arm's own engine scores its policy far
# below the shared evaluator; on sim-h100 the two agree up to noise.
FINALS = {"sim-a100": [(0.10, 0.40), (0.12, 0.45), (0.08, 0.41)],
          "sim-h100": [(0.50, 0.52), (0.55, 0.53), (0.47, 0.49)]}


def _results(with_ref: bool) -> list[TrialResult]:
    out = []
    for pool, finals in FINALS.items():
        for seed, (own, ref) in enumerate(finals):
            curves = {M.EVAL_REWARD: [(10, 0.05), (20, own)], M.TRAIN_REWARD: [(10, 0.1), (20, own)]}
            if with_ref:
                curves[M.EVAL_REWARD_REF] = [(10, 0.06), (20, ref)]
            i = len(out)
            out.append(TrialResult(
                trial_id=f"t{i:012x}", run_id=f"{i:032x}", axes={"pool": pool}, seed=seed,
                pool=pool, status="done", verdict="healthy", verdict_step=None, verdict_reason="",
                derived_from=None, curves=curves, latest={}, segments=[Segment(1, pool, 1, 20)]))
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_both_numbers_reach_cells_trials_tables_plots_and_comparisons(tmp_path: Path) -> None:
    decl = CompareDecl(axis="pool", baseline="sim-h100", target="final_reward_ref")
    build_report(_results(True), ["pool"], None, None, tmp_path, grid_name="g", store="s",
                 compare=[decl], steps=20)
    cells = {r["pool"]: r for r in _rows(tmp_path / "cells.csv")}
    assert abs(float(cells["sim-a100"]["final_reward_ref"]) - 0.42) < 1e-9
    assert abs(float(cells["sim-a100"]["own_minus_ref"]) - (-0.32)) < 1e-9
    assert float(cells["sim-a100"]["own_minus_ref_hi"]) < 0  # own below the reference, decided
    trials = _rows(tmp_path / "trials.csv")
    assert [float(t["final_reward_ref"]) for t in trials][:3] == [0.40, 0.45, 0.41]
    md = (tmp_path / "summary.md").read_text()
    assert "## Reference evaluation" in md and "ref final 0.420" in md
    assert "disagree (own - reference excludes 0) in 1 of 2 cells: pool=sim-a100." in md
    assert "Reference evaluation" in (tmp_path / "summary.html").read_text()
    assert (tmp_path / "curves_reward_ref.png").exists()
    comps = [r for r in _rows(tmp_path / "comparisons.csv") if r["target"] == "final_reward_ref"]
    assert len(comps) == 1 and abs(float(comps[0]["difference"]) - (0.42 - 0.5133333333)) < 1e-6


def test_trials_without_reference_scores_change_nothing(tmp_path: Path) -> None:
    build_report(_results(False), ["pool"], None, None, tmp_path, grid_name="g", store="s")
    assert "final_reward_ref" not in _rows(tmp_path / "cells.csv")[0]
    assert "final_reward_ref" not in _rows(tmp_path / "trials.csv")[0]
    assert "Reference evaluation" not in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "curves_reward_ref.png").exists()


def test_the_section_names_the_grids_evaluator_and_never_a_best_cell_of_a_tie() -> None:
    """verl's reference scores checkpoints greedily, the simulator's samples every eval step:
    the section says which ran. Cells that all tie (a policy that answers nothing, own and
    reference 0 everywhere) have no best cell; a tie at the top names every cell in it."""
    from orchestrator.compare import _reference as RF

    assert "sampling noise per seed" in RF.intro(frozenset({"sim"}))
    assert "greedy" in RF.intro(frozenset({"cpu"})) and "noise" not in RF.intro(frozenset({"cpu"}))
    assert "On the verl pools" in RF.intro(frozenset({"sim", "gpu"}))
    zero = {"final_reward": 0.0, "final_reward_ref": 0.0, "own_minus_ref": 0.0,
            "own_minus_ref_lo": 0.0, "own_minus_ref_hi": 0.0}
    lines = RF._summary_lines([("a", zero), ("b", zero)])
    assert lines[-1] == "Every cell has the same final value by either number: neither ranks them."
    top = {**zero, "final_reward": 0.5, "final_reward_ref": 0.5}
    lines = RF._summary_lines([("a", top), ("b", top), ("c", zero)])
    assert lines[-1] == "The best cell is the same by either number (a; b)."


def test_scores_of_an_evaluation_job_name_its_evaluator_and_a_mixture_is_flagged(
        tmp_path: Path) -> None:
    """Scores ``ablate evaluate`` made with the engine reference (``reference.json``, target
    ``engine``) reach the curves, and the section names the job's evaluator (its pool and
    engine settings) instead of the fp32 trainer; trials scored by two different jobs are not
    one evaluator for every arm, and the section says so."""
    from orchestrator.compare._data import merge_reference
    from orchestrator.store import TrialPaths
    from orchestrator.store.reference import ReferenceScores, write_reference

    results = _results(False)[:2]
    grid_dir = tmp_path / "grid"
    names = ["verl-engine-ref-1 pool=cpu-fp32 rollout={}", "verl-engine-ref-1 pool=h100 rollout={}"]
    for r, name, value in zip(results, names, (0.3, 0.4)):
        paths = TrialPaths(grid_dir, r.trial_id)
        paths.root.mkdir(parents=True)
        write_reference(paths, ReferenceScores("engine", name, {20: (value, 9.0)}))
    merge_reference(results[:1], grid_dir)
    assert results[0].curves[M.EVAL_REWARD_REF] == [(20, 0.3)]
    assert results[0].reference_job == names[0]
    for sub in ("one", "two"):
        (tmp_path / sub).mkdir()
    report = build_report(results[:1], ["pool"], None, None, tmp_path / "one", grid_name="g",
                          store="s", pool_kinds=frozenset({"cpu"}))
    assert f"`{names[0]}`" in report["reference_intro"]
    assert "model in fp32" not in report["reference_intro"]
    assert "Warning" not in report["reference_intro"]
    merge_reference(results, grid_dir)
    report = build_report(results, ["pool"], None, None, tmp_path / "two", grid_name="g",
                          store="s", pool_kinds=frozenset({"cpu"}))
    assert "different evaluators" in report["reference_intro"]
    assert "different evaluators" in (tmp_path / "two" / "summary.md").read_text()


def test_own_minus_reference_pairs_the_two_scores_of_one_step() -> None:
    """A trial whose last checkpoint was not scored by the reference (``ablate evaluate`` over a
    damaged checkpoint) pairs its own score at the last step both have, not its own final."""
    from orchestrator.compare._reference import cell_stats

    trials = []
    for seed, (own10, own20, ref10) in enumerate([(0.30, 0.60, 0.35), (0.32, 0.70, 0.36),
                                                  (0.28, 0.65, 0.33)]):
        curves = {M.EVAL_REWARD: [(10, own10), (20, own20)], M.EVAL_REWARD_REF: [(10, ref10)]}
        trials.append(TrialResult(
            trial_id=f"t{seed:012x}", run_id=f"{seed:032x}", axes={"pool": "p"}, seed=seed,
            pool="p", status="done", verdict="healthy", verdict_step=None, verdict_reason="",
            derived_from=None, curves=curves, latest={}, segments=[Segment(1, "p", 1, 20)]))
    stats = cell_stats(trials)
    assert abs(stats["own_minus_ref"] - (-0.04666666666)) < 1e-6, stats  # step 10's, not 20's
    assert stats["own_minus_ref_hi"] < 0
    # No step with both scores: no pair, so no difference (not own final minus reference).
    lone = [TrialResult(**{**t.__dict__, "curves": {M.EVAL_REWARD: [(20, 0.6)],
                                                    M.EVAL_REWARD_REF: [(10, 0.35)]}})
            for t in trials]
    assert cell_stats(lone)["own_minus_ref"] != cell_stats(lone)["own_minus_ref"]  # nan


def test_a_trial_moved_to_another_pool_in_place_names_every_pool_it_ran_on(tmp_path) -> None:
    """An ``infra_failed`` rescue (or ``ablate resume --pool``) continues a trial under its own id
    on another pool: trials.csv's pool column names both, in order, not the first only."""
    moved, stayed = _results(False)[:2]
    moved.segments = [Segment(1, "sim-a100", 1, 10), Segment(2, "sim-h100", 11, 20)]
    build_report([moved, stayed], ["pool"], None, None, tmp_path, grid_name="g", store="s",
                 steps=20)
    pools = {t["trial_id"]: t["pool"] for t in _rows(tmp_path / "trials.csv")}
    assert pools == {moved.trial_id: "sim-a100>sim-h100", stayed.trial_id: "sim-a100"}
