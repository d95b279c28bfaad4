"""``ablate probe --attribute`` on verl (issue 56): the knobs a configuration sets away from the
fp32 trainer's arithmetic (``probe/verl_job.py``'s ``KNOBS``), read at plan time (no verl job
runs here), and paired with the configuration's own probe rows."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.grid import expand, load_grid
from orchestrator.probe import verl_job
from orchestrator.probe._run import Measured
from orchestrator.probe._summary import _knob_delta
from orchestrator.verl.trainer import VerlTrainer

REPO = Path(__file__).resolve().parents[2]


def _configs(name: str) -> dict[str, object]:
    grid = load_grid(REPO / "grids" / name)
    return {" ".join(f"{k}={v}" for k, v in t.axes): (t, grid.trial_config(t)) for t in expand(grid)}


def _vllm_cpu_env() -> bool:
    from orchestrator.pools import load_catalog
    from orchestrator.verl import cpu_engines

    return cpu_engines.installed_version(load_catalog().get("cpu-fp32")) is not None


def _knobs(name: str) -> dict[str, dict[str, str]]:
    return {label: verl_job.VerlProbe.knobs(config, config.pool)
            for label, (_, config) in _configs(name).items()}


def test_the_knobs_are_what_each_configuration_sets_away_from_fp32() -> None:
    assert _knobs("verl_cpu.yaml") == {  # cpu-bf16: the pool's verl_overrides set bfloat16
        "correction.is_level=none pool=cpu-fp32": {},
        "correction.is_level=none pool=cpu-bf16": {"rollout.dtype": "bf16->fp32"},
        "correction.is_level=token pool=cpu-fp32": {},
        "correction.is_level=token pool=cpu-bf16": {"rollout.dtype": "bf16->fp32"},
    }
    learner = _knobs("verl_cpu_learner.yaml")
    assert learner["learner=dppo-bf16"] == {"learner.precision": "bf16->fp32"}, learner
    assert learner["learner=gspo-token-is"] == {}, learner


@pytest.mark.skipif(not _vllm_cpu_env(), reason="plan needs the vLLM-CPU environment (ablate vllm-cpu-env)")
def test_vllm_compiled_is_a_knob() -> None:
    assert _knobs("verl_cpu_vllm.yaml") == {
        "rollout.engine=cpu rollout.dtype=bf16": {"rollout.dtype": "bf16->fp32"},
        "rollout.engine=cpu rollout.dtype=fp32": {},
        "rollout.engine=vllm rollout.dtype=bf16": {"rollout.dtype": "bf16->fp32"},
        "rollout.engine=vllm rollout.dtype=fp32": {},
        "rollout.engine=vllm rollout.dtype=bf16 rollout.enforce_eager=false pool=cpu-fp32": {
            "rollout.dtype": "bf16->fp32", "rollout.enforce_eager": "false->true"},
    }


@pytest.mark.parametrize("grid", ["verl_cpu.yaml", "verl_cpu_learner.yaml"])
def test_the_rollout_dtype_is_the_one_verl_gets(grid: str) -> None:
    """The pool's ``verl_overrides`` (cpu-bf16: bfloat16) or the grid's ``rollout.dtype``, as the
    trainer's own override list hands it to verl."""
    for trial, config in _configs(grid).values():
        items = dict(i.split("=", 1) for i in VerlTrainer.overrides(trial, config))
        verl_dtype = (items.get(verl_job.ROLLOUT_DTYPE) or "").strip("'\"") or None
        expected = verl_job.VERL_DTYPES.get(verl_dtype, verl_dtype) if verl_dtype else None
        assert verl_job.rollout_dtype(config) == expected, (trial.axes, verl_dtype)


def test_a_turned_knob_reaches_verls_override_list() -> None:
    (trial, config), = [v for k, v in _configs("verl_cpu.yaml").items()
                        if k == "correction.is_level=none pool=cpu-bf16"]
    items = dict(i.split("=", 1) for i in VerlTrainer.overrides(trial, config.updated(
        {"rollout.dtype": verl_job.KNOBS["rollout.dtype"]})))
    assert items[verl_job.ROLLOUT_DTYPE].strip("'\"") == "float32"
    (trial, config), = [v for k, v in _configs("verl_cpu_learner.yaml").items()
                        if k == "learner=dppo-bf16"]
    turned = config.updated({"learner.precision": verl_job.KNOBS["learner.precision"]})
    assert VerlTrainer.overrides(trial, turned) != VerlTrainer.overrides(trial, config)


def test_a_knob_pairs_with_the_configurations_own_rows() -> None:
    own = [{"seed": 0, "batch": b, "rollout_corr/k3_kl": 1e-6 * b} for b in (1, 2, 3)]
    knob = [{"seed": 0, "batch": b, "k3_without": 0.0} for b in (1, 2, 3)]
    m = Measured(None, own, {}, 0.0, False)  # type: ignore[arg-type]
    delta = _knob_delta(m, knob)
    assert delta.estimate == pytest.approx(2e-6) and delta.n == 3
    both = [{**r, "k3": 5.0} for r in knob]  # a job that measured the configuration beside it
    assert _knob_delta(m, both).estimate == pytest.approx(5.0)
