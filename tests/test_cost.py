"""Cost of a trial from its attempts: accelerator-hours, time lost to retries, time early stop saved."""
from __future__ import annotations

import pytest

from orchestrator.cost import cost_tags, from_tags, pool_rate, total, trial_cost
from orchestrator.pools import load_catalog
from orchestrator.trial import Attempt


def test_pool_rate_counts_gpus_per_trial_and_labels_cpu_hours() -> None:
    cat = load_catalog()
    assert pool_rate(cat.get("h100")) == (8, "gpu_hours")
    assert pool_rate(cat.get("sim-h100")) == (1, "cpu_hours")
    assert pool_rate(cat.get("cpu")) == (2, "cpu_hours")  # 2 gloo ranks, one CPU each


def test_retry_loses_the_redone_steps_and_early_stop_saves_the_steps_not_run() -> None:
    # Attempt 1 ran steps 1-60 in 600 s on 8 GPUs and died; attempt 2 resumed from the
    # checkpoint of step 50 and ran 51-150 in 1000 s, then early stop ended the trial at 150.
    attempts = [Attempt(1, "h100", 1, 60, "infra_failure", started_at=0.0, ended_at=600.0,
                        accelerators=8, unit="gpu_hours"),
                Attempt(2, "h100", 51, 150, "stopped_early", started_at=700.0, ended_at=1700.0,
                        accelerators=8, unit="gpu_hours")]
    c = trial_cost(attempts, 400)
    assert c.unit == "gpu_hours" and c.steps_run == 160
    assert c.hours == pytest.approx(1600 * 8 / 3600)
    assert c.retry_hours == pytest.approx(10 * 10 * 8 / 3600)  # steps 51-60 ran twice, 10 s each
    assert c.step_s == pytest.approx(10.0)
    assert c.saved_hours == pytest.approx(250 * 10 * 8 / 3600)  # steps 151-400 never ran
    back = from_tags(cost_tags(c))
    assert (back.hours, back.retry_hours, back.saved_hours) == pytest.approx(
        (c.hours, c.retry_hours, c.saved_hours), rel=1e-5)  # tags hold 6 digits


def test_a_running_attempt_counts_up_to_now_and_units_never_mix() -> None:
    running = [Attempt(1, "sim-h100", 1, None, None, started_at=100.0, accelerators=1, unit="cpu_hours")]
    c = trial_cost(running, 10, now=460.0)
    assert c.running and c.hours == pytest.approx(0.1) and c.saved_hours == 0
    assert trial_cost([], 10) is None
    gpu = trial_cost([Attempt(1, "h100", 1, 10, "completed", started_at=0.0, ended_at=3600.0,
                              accelerators=8, unit="gpu_hours")], 10)
    t = total([c, gpu, None])
    assert t["gpu_hours"]["hours"] == pytest.approx(8.0) and t["cpu_hours"]["hours"] == pytest.approx(0.1)


def test_attempts_recorded_before_rates_fall_back_to_the_pool() -> None:
    old = [Attempt(1, "h100", 1, 10, "completed", started_at=0.0, ended_at=1800.0)]
    assert trial_cost(old, 10, pools={"h100": load_catalog().get("h100")}).hours == pytest.approx(4.0)


def test_an_attempt_closed_without_an_end_time_does_not_keep_costing() -> None:
    dead = [Attempt(1, "sim-h100", 1, 30, "infra_failure", started_at=0.0, accelerators=1, unit="cpu_hours"),
            Attempt(2, "sim-h100", 26, 60, "completed", started_at=360.0, ended_at=720.0,
                    accelerators=1, unit="cpu_hours")]
    c = trial_cost(dead, 60, now=1e9)
    assert c.hours == pytest.approx(0.2)  # 360 s (until the retry started) + 360 s


def test_an_evaluation_jobs_time_counts_at_its_pools_rate_and_only_in_the_trials_unit() -> None:
    """The engine reference's job holds its evaluation pool's accelerators: its seconds count
    at that rate in the trial's reference column; in another unit (a cpu evaluation pool
    scoring a gpu trial) they are not added to a row of GPU-hours (reference.json keeps them)."""
    from orchestrator.cost import CPU_HOURS, GPU_HOURS, TrialCost, with_reference

    gpu = TrialCost(hours=10.0, unit=GPU_HOURS)
    assert with_reference(gpu, 0.0, 360.0).reference_hours == pytest.approx(0.1)
    assert with_reference(gpu, 0.0, 360.0, (8, GPU_HOURS)).reference_hours == pytest.approx(0.8)
    assert with_reference(gpu, 0.0, 360.0, (1, CPU_HOURS)) == gpu
    assert with_reference(None, 0.0, 360.0, (8, GPU_HOURS)) is None
