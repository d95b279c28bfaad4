"""Grids every command refuses at plan time, whatever ``plan`` is asked to show (issue 59).

``ablate plan`` builds each trial's backend arguments (verl: the full override list with the
pool's ``verl_overrides``) as ``--show-overrides`` and the job do, so one validation refuses
for every command: rollout log-probs that are not the distribution verl's trainer recomputes
(top-p / top-k on vLLM's processed log-probs, temperature with raw log-probs), GRPO settings verl only checks in the
job, and one verl setting given under two names. Each file's first line says what the one-line
error must contain. Plan-level only: no verl import, about 0.1 s a case.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main

CASES = sorted((Path(__file__).parents[1] / "data" / "plan_refusals").glob("*.yaml"))


@pytest.mark.parametrize("show", [[], ["--show-overrides"]], ids=["plain", "show-overrides"])
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_plan_refuses_in_one_line_with_or_without_show_overrides(
        path: Path, show: list[str], isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expect = path.read_text().split("\n", 1)[0].removeprefix("# expect: ").strip()
    rc = main(["plan", str(path), *show])
    out, err = capsys.readouterr()
    # A missing engine package on this machine only warns (the gpu pool's image has it).
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}:") and expect in lines[0], lines[0]
    assert lines[0].count("; fix: ") == 1 and "Traceback" not in err and out == ""
    assert not (isolated / ".ablate").exists()


def test_truncated_sampling_runs_with_vllms_raw_log_probs(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fix the refusal names plans: raw log-probs at temperature 1 are the full-vocabulary
    distribution the trainer recomputes, whatever top-k the engine samples with."""
    grid = isolated / "ok.yaml"
    grid.write_text("name: ok\nrecipe: verl/qwen3_4b_dapo\nbackend: verl\nsteps: 10\npool: h100\n"
                    "axes:\n  actor_rollout_ref.rollout.top_k: [-1, 20]\n"
                    "overrides: {rollout.engine: vllm, rollout.logprobs_mode: raw}\n")
    assert main(["plan", str(grid), "--json"]) == 0
    assert '"count": 2' in capsys.readouterr().out


def test_truncated_sampling_runs_on_sglang_whose_log_probs_are_the_full_vocabulary(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang 0.5.12 returns log_softmax(logits / T) over the whole vocabulary whatever top-p /
    top-k it samples with (tests/verl/test_engine_contract.py runs its sampler): the trainer's
    distribution, so such a grid plans."""
    grid = isolated / "ok.yaml"
    grid.write_text("name: ok\nrecipe: verl/qwen3_4b_dapo\nbackend: verl\nsteps: 10\npool: h100\n"
                    "axes:\n  actor_rollout_ref.rollout.top_p: [1.0, 0.9]\n"
                    "  actor_rollout_ref.rollout.top_k: [-1, 20]\n"
                    "overrides: {rollout.engine: sglang, rollout.temperature: 0.7}\n")
    assert main(["plan", str(grid), "--json", "--show-overrides"]) == 0
    assert '"count": 4' in capsys.readouterr().out


def test_sglangs_pre_temperature_log_probs_are_refused_away_from_temperature_1(
        isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pool whose ``verl_env`` sets SGLANG_RETURN_ORIGINAL_LOGPROB makes SGLang return the
    log-probs before temperature scaling: refused at temperature 0.7, not at 1.0."""
    import yaml

    catalog = yaml.safe_load((Path(__file__).parents[2] / "orchestrator" / "pools.yaml").read_text())
    pool = catalog["pools"]["h100"]
    pool["verl_env"] = {**(pool.get("verl_env") or {}), "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
    (isolated / "pools.yaml").write_text(yaml.safe_dump({"pools": {"h100": pool}}))
    for temperature, rc in ((1.0, 0), (0.7, 2)):
        grid = isolated / f"g{rc}.yaml"
        grid.write_text("name: g\nrecipe: verl/qwen3_4b_dapo\nbackend: verl\nsteps: 10\n"
                        "pool: h100\npool_catalog: pools.yaml\noverrides: {rollout.engine: "
                        f"sglang, rollout.temperature: {temperature}}}\n")
        assert main(["plan", str(grid)]) == rc
        err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning: ")]
        if rc:
            assert len(err) == 1 and "SGLANG_RETURN_ORIGINAL_LOGPROB set" in err[0], err
            assert "fix: unset SGLANG_RETURN_ORIGINAL_LOGPROB" in err[0]


@pytest.mark.parametrize(("axes", "what"), [
    ('  corr:\n    "ok\\e]0;PWNED\\a": {correction.is_level: token}\n    plain: {}\n',
     "bundle name 'ok\\x1b]0;PWNED\\x07'"),
    ('  task.name: [progression, "pro\\e[2Jgression"]\n', "axis value 'pro\\x1b[2Jgression'"),
    ('  "x\\e]8;;http://e/\\a":\n    a: {}\n', "axis name 'x\\x1b]8;;http://e/\\x07'"),
    ('  "correction.is_levl\\e[31m": [token]\n', "correction.is_levl\\x1b[31m"),  # any error
])
def test_names_with_terminal_control_characters_are_refused_and_shown_escaped(
        isolated: Path, capsys: pytest.CaptureFixture[str], axes: str, what: str) -> None:
    """An ESC / OSC sequence in a name the grid defines would retitle a terminal or hide text
    in every table, log and error line that shows the name: refused at plan, and every user
    error shows control characters escaped."""
    grid = isolated / "g.yaml"
    grid.write_text(f"name: g\nrecipe: sim/grpo_tiny\nsteps: 4\npool: sim-a100\naxes:\n{axes}")
    assert main(["plan", str(grid)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and what in err, err
    assert not any(c in err for c in "\x1b\x07\x9d") and out == ""
