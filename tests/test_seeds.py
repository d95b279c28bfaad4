"""Which cell gets the next adaptive seed, and what deciding a comparison would cost."""
from __future__ import annotations

import math
from pathlib import Path

from orchestrator.schema import AdaptiveSeedsSpec, CompareDecl
from orchestrator.stats.seeds import Outcome, comparisons, needs_seed, seeds_to_decide

SPEC = AdaptiveSeedsSpec(min=2, max=6, target="collapse_rate", ci_width=0.4)
DECL = [CompareDecl(axis="corr", baseline="none")]


def _cell(corr: str, pool: str) -> tuple:
    return (("corr", corr), ("pool", pool))


def _outs(*collapsed: bool, hours: float = 1.0) -> list[Outcome]:
    return [Outcome(i, c, math.nan, hours) for i, c in enumerate(collapsed)]


def test_decided_comparisons_stop_and_undecided_ones_come_first() -> None:
    cells = {_cell("none", "a"): _outs(True, True), _cell("tis", "a"): _outs(False, False),
             _cell("none", "b"): _outs(True, False), _cell("tis", "b"): _outs(False, False),
             _cell("solo", "c"): _outs(True, False)}  # in no comparison: width only
    comps = comparisons(cells, DECL, "collapse_rate", multiplicity="none")
    assert {(c.context, c.decided) for c in comps} == {("pool=a", True), ("pool=b", False)}
    order = needs_seed(cells, SPEC, comps, {k: len(v) for k, v in cells.items()})
    # pool a is decided at 2 seeds each; pool b's two cells first, then the wide solo cell.
    assert order[:2] == [_cell("none", "b"), _cell("tis", "b")] or order[:2] == [_cell("tis", "b"), _cell("none", "b")]
    assert order[2:] == [_cell("solo", "c")]


def test_a_running_seed_holds_its_cell_and_its_comparison_partner() -> None:
    cells = {_cell("none", "b"): _outs(True, False), _cell("tis", "b"): _outs(False, False)}
    comps = comparisons(cells, DECL, "collapse_rate")
    started = {_cell("none", "b"): 3, _cell("tis", "b"): 2}  # seed 2 of none@b still runs
    assert needs_seed(cells, SPEC, comps, started) == []


def test_cells_stop_at_max_or_at_the_width() -> None:
    narrow = AdaptiveSeedsSpec(min=2, max=4, target="final_reward", ci_width=0.1)
    cells = {(("x", "1"),): [Outcome(i, False, 0.50 + 0.001 * i) for i in range(3)],
             (("x", "2"),): [Outcome(i, False, r) for i, r in enumerate([0.2, 0.8, 0.5, 0.1])]}
    assert needs_seed(cells, narrow, [], {k: len(v) for k, v in cells.items()}) == []


def test_seeds_to_decide_grows_as_the_difference_shrinks() -> None:
    cells = {_cell("none", "b"): _outs(True, False, True, False), _cell("tis", "b"): _outs(False, False, False, False)}
    [comp] = comparisons(cells, DECL, "collapse_rate")
    # 2/4 vs 0/4: shrunk variances 1/4 + 5/36, z^2 = 3.84, d = 0.5 -> 6 seeds per cell: 2 more each.
    spec = AdaptiveSeedsSpec(min=2, max=40, target="collapse_rate", ci_width=0.3)
    assert seeds_to_decide(comp, cells[comp.cell], cells[comp.base_cell], spec) == 4
    five = AdaptiveSeedsSpec(min=2, max=5, target="collapse_rate", ci_width=0.3)
    assert seeds_to_decide(comp, cells[comp.cell], cells[comp.base_cell], five) is None  # > max
    same = {_cell("none", "b"): _outs(False, False), _cell("tis", "b"): _outs(False, False)}
    [flat] = comparisons(same, DECL, "collapse_rate")
    assert seeds_to_decide(flat, same[flat.cell], same[flat.base_cell], spec) is None  # no difference


def test_holm_adjusts_over_the_declared_comparisons() -> None:
    """2/2 vs 0/2 is decided alone (p 0.028, the Newcombe interval excludes 0) but not as one of
    two comparisons under Holm (0.056); Benjamini-Hochberg agrees here (the other p is 1)."""
    cells = {_cell("none", "a"): _outs(True, True), _cell("tis", "a"): _outs(False, False),
             _cell("none", "b"): _outs(True, False), _cell("tis", "b"): _outs(True, False)}
    alone = comparisons({k: v for k, v in cells.items() if dict(k)["pool"] == "a"}, DECL, "collapse_rate")
    assert [c.decided for c in alone] == [True] and alone[0].diff.decided
    assert math.isclose(alone[0].p_value, alone[0].p_adjusted)
    for method in ("holm", "bh"):
        comps = {c.context: c for c in comparisons(cells, DECL, "collapse_rate", multiplicity=method)}
        a = comps["pool=a"]
        assert a.p_value < 0.05 < a.p_adjusted and not a.decided and a.diff.decided
        assert math.isclose(a.p_adjusted, 2 * a.p_value, rel_tol=1e-6)
        assert comps["pool=b"].p_value == 1.0


def test_a_comparison_declared_twice_is_counted_once() -> None:
    """The documented pattern (every target, and again with a margin on one) and a plain repeat
    make one comparison: Holm adjusts over 1, not 2, so 2/2 vs 0/2 (p 0.028) stays decided, and
    the margin joins it."""
    cells = {_cell("none", "a"): _outs(True, True), _cell("tis", "a"): _outs(False, False)}
    for decls in ([DECL[0], CompareDecl(axis="corr", baseline="none", target="collapse_rate",
                                        margin=0.5)],
                  [DECL[0], DECL[0]]):
        [c] = comparisons(cells, decls, "collapse_rate")
        assert c.family == 1 and c.decided and math.isclose(c.p_value, c.p_adjusted)
    [c] = comparisons(cells, [DECL[0], CompareDecl(axis="corr", baseline="none",
                                                   target="collapse_rate", margin=0.5)],
                      "collapse_rate")
    assert c.margin == 0.5 and c.equivalence
    # The margin is on its own target only: on another target the comparison has none.
    [r] = comparisons(cells, [DECL[0], CompareDecl(axis="corr", baseline="none",
                                                   target="collapse_rate", margin=0.5)],
                      "final_reward")
    assert r.margin is None and r.family == 1


def test_time_to_collapse_is_decided_by_log_rank_and_sized_by_rmst() -> None:
    late = [Outcome(i, False, math.nan, 1.0, 100) for i in range(6)]
    early = [Outcome(i, True, math.nan, 1.0, s) for i, s in enumerate([10, 12, 15, 20, 25, 30])]
    cells = {(("corr", "none"),): early, (("corr", "tis"),): late}
    [c] = comparisons(cells, DECL, "time_to_collapse", horizon=100)
    assert c.decided and c.p_value < 0.01
    assert math.isclose(c.diff.estimate, 100 - (10 + 12 + 15 + 20 + 25 + 30) / 6)
    # Two seeds each: the log-rank test cannot decide, however far apart the times are.
    few = {k: v[:2] for k, v in cells.items()}
    [c2] = comparisons(few, DECL, "time_to_collapse", horizon=100)
    assert not c2.decided and c2.p_value > 0.05


def test_time_to_collapse_cells_without_collapses_keep_getting_seeds() -> None:
    """Greenwood's RMST interval is a point for a cell with no collapse; adaptive seeds widen it to
    the Wilson interval of the collapse-free share, so 2 healthy seeds do not settle a cell."""
    from orchestrator.stats.seeds import cell_interval, relative_width

    spec = AdaptiveSeedsSpec(min=2, max=10, target="time_to_collapse", ci_width=0.3)
    healthy = [Outcome(i, False, math.nan, 1.0, 120) for i in range(2)]
    iv = cell_interval(healthy, "time_to_collapse", horizon=120)
    assert iv.estimate == 120 and relative_width(iv, "time_to_collapse", 120) > 0.6
    cells = {(("corr", "tis"),): healthy}
    assert needs_seed(cells, spec, [], {k: 2 for k in cells}, 120) == list(cells)
    many = {(("corr", "tis"),): [Outcome(i, False, math.nan, 1.0, 120) for i in range(10)]}
    assert needs_seed(many, spec, [], {k: 10 for k in many}, 120) == []


def test_a_declared_reward_range_bounds_the_cell_interval_and_scales_its_width(tmp_path: Path) -> None:
    from orchestrator.grid import load_grid
    from orchestrator.stats.seeds import cell_interval, relative_width

    rewards = [Outcome(i, False, r) for i, r in enumerate([-0.99, -0.95, -0.2])]
    plain = cell_interval(rewards, "final_reward")  # outside [0, 1]: the plain t interval
    assert plain.low < -1
    iv = cell_interval(rewards, "final_reward", reward_range=(-1.0, 1.0))
    assert -1 < iv.low < iv.estimate < iv.high < 1 and iv.estimate == plain.estimate
    assert relative_width(iv, "final_reward", reward_range=(-1.0, 1.0)) == iv.width / 2
    (tmp_path / "g.yaml").write_text("name: g\nrecipe: sim/grpo_tiny\nsteps: 10\npool: sim-h100\n"
                                     "metrics: {range: {reward: [-1, 1]}}\n")
    grid = load_grid(tmp_path / "g.yaml")
    assert load_grid(Path(__file__).parents[1] / "grids" / "quickstart.yaml").spec.metrics.bounds() == (0.0, 1.0)
    assert grid.spec.metrics.bounds("reward") == (-1.0, 1.0)
    # Width 1.87 of the range's 2 meets ci_width 0.95; read on [0, 1] (2.2 wide) it would not.
    spec = SPEC.model_copy(update={"target": "final_reward", "ci_width": 0.95})
    cells = {_cell("none", "a"): rewards}
    assert needs_seed(cells, spec, [], {_cell("none", "a"): 3}) == [_cell("none", "a")]
    assert needs_seed(cells, spec, [], {_cell("none", "a"): 3}, reward_range=grid.spec.metrics.bounds()) == []
