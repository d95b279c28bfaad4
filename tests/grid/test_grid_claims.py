"""What a grid claims must be recordable, else ``ablate plan`` refuses it (one line, exit 2):
names MLflow would store under one param, comparisons that can never be made, and search or
adaptive-seed targets no trial can record (``grid/_cells.py``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main

HEAD = """\
name: claims
recipe: sim/grpo_tiny
steps: 20
seeds: [0, 1]
pool: sim-h100
"""

SEARCH = "search:\n  params:\n    correction.is_bounds[1]: {low: 1.2, high: 5.0}\n"

CASES = {
    # Axis or include names one MLflow param key would hold.
    "sanitised-bundle-names": (
        ("axes:\n  correction (IS): {a: {correction.is_level: none}, b: {correction.is_level: token}}\n"
        "  correction _IS_: {c: {}, d: {train.lr: 0.002}}\n"),
        "'correction _IS_' and 'correction (IS)' are both stored as the MLflow param 'correction _IS_'"),
    "eq-next-to-underscore": (
        "axes:\n  lr=x: {a: {}, b: {train.lr: 0.002}}\n  lr_x: {c: {}, d: {train.ppo_epochs: 2}}\n",
        "'lr_x' and 'lr=x' are both stored as the MLflow param 'lr_x'"),
    "non-ascii-next-to-ascii": (
        "axes:\n  \"lr\u00b7x\": {a: {}, b: {train.lr: 0.002}}\n  lr_x: {c: {}, d: {train.ppo_epochs: 2}}\n",
        "are both stored as the MLflow param 'lr_x'"),
    # Comparisons that can never be made.
    "identical-after-dedup": (
        ("overrides: {correction.is_level: none}\naxes:\n  correction.is_mode: [truncate, mask]\n"
        "compare: {axis: correction.is_mode, baseline: truncate}\n"),
        ("correction.is_mode=mask can never be compared with the baseline correction.is_mode=truncate: "
        "both resolve to one configuration")),
    "baseline-excluded-by-value": (
        ("axes:\n  correction.is_level: [none, token]\n  train.lr: [0.001, 0.002]\n"
        "exclude: [{correction.is_level: none}]\n"
        "compare: {axis: correction.is_level, baseline: none}\n"),
        "'exclude:' removes its baseline cell"),
    "baseline-seeds-all-excluded": (
        ("axes:\n  correction.is_level: [none, token]\n"
        "exclude: [{correction.is_level: none, seed: [0, 1]}]\n"
        "compare: {axis: correction.is_level, baseline: none}\n"),
        "'exclude:' removes its baseline cell (by value or every seed)"),
    "compare-with-search": (
        "axes:\n  correction.is_mode: [truncate, mask]\noverrides:\n  correction.is_level: token\n"
        "  correction.is_bounds: [null, 2.0]\n"
        + SEARCH + "  budget: 2\n"
        "compare: {axis: correction.is_mode, baseline: truncate}\n",
        "'compare:' cannot be combined with 'search:'"),
    # Targets no trial can record.
    "objective-typo": (
        "axes:\n  correction.is_mode: [truncate, mask]\noverrides:\n  correction.is_level: token\n"
        "  correction.is_bounds: [null, 2.0]\n"
        + SEARCH + "  objective: {metric: eval/rewrad/final}\n",
        "no sim trial ever reports metric 'eval/rewrad/final'.*did you mean 'eval/reward/final'"),
    "objective-never-evaluated": (
        "axes:\n  correction.is_mode: [truncate, mask]\noverrides:\n  correction.is_level: token\n"
        "  correction.is_bounds: [null, 2.0]\n  eval.every: 50\n"
        + SEARCH + "  budget: 2\n",
        "objective 'eval/reward/final' is never evaluated: eval.every is 50 and a trial runs 20 steps"),
    "collapse-rate-without-rules": (
        "axes:\n  correction.is_level: [none, token]\ncollapse: {rules: []}\n",
        "collapse_rate is not recorded by this grid: it has no collapse rules"),
    "collapse-rate-only-unstable": (
        ("axes:\n  correction.is_level: [none, token]\n"
        "collapse: {rules: [{name: wobble, metric: actor/grad_norm, kind: above, threshold: 10,"
        " verdict: unstable}]}\n"),
        "its rules can only give 'unstable' \\(wobble\\)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_claim_that_cannot_be_recorded_is_refused_at_plan(
    isolated: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    import re

    body, needle = CASES[case]
    if case.startswith("collapse-rate"):
        text = HEAD.replace("seeds: [0, 1]\n", "seeds: {adaptive: {min: 2, max: 4, target: collapse_rate}}\n")
    else:
        text = HEAD
    path = isolated / f"{case}.yaml"
    path.write_text(text + body)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {path}:"), err
    assert re.search(needle if case in ("objective-typo", "collapse-rate-only-unstable")
                     else re.escape(needle), err), err
    assert "fix:" in err or "did you mean" in err, err
    assert not (isolated / ".ablate").exists()


def test_comparable_grids_still_plan(isolated: Path) -> None:
    """The same shapes, made comparable: a slice where is_mode matters, a baseline kept."""
    path = isolated / "ok.yaml"
    path.write_text(HEAD + "axes:\n  correction.is_level: [none, token]\n"
                    "  correction.is_mode: [truncate, mask]\n"
                    "exclude: [{correction.is_level: none, correction.is_mode: mask}]\n"
                    "compare: {axis: correction.is_mode, baseline: truncate}\n")
    assert main(["plan", str(path)]) == 0
