"""What a trial costs: accelerator-hours from its attempts (wall time x the pool's accelerators).

An attempt records the pool's accelerator count and unit when it starts (``Attempt.accelerators``,
``Attempt.unit``) and its wall-clock start and end, so its cost needs nothing but
``attempts.json``. Units: ``gpu_hours`` on ``kind: gpu`` pools (GPUs per node x nodes),
``cpu_hours`` on the simulator (one CPU per trial) and on ``kind: cpu`` pools (one CPU per gloo
rank): CPU-hours are labelled as such and never added to GPU-hours.

Besides the hours spent, a trial's cost says where they went:

- ``retry_hours``: time lost to infra failures: the wall time of a failed attempt minus the
  steps the next attempt kept (it resumed from a checkpoint), at the failed attempt's step time;
- ``saved_hours``: time early stop saved: the steps not run (``steps - last step``) of a trial
  stopped early, at its measured step time;
- ``reference_hours``: time the reference evaluator took (``eval: {reference: ...}``,
  ``orchestrator/evaluation.py``): its ``timing_s/eval_ref`` inside the trial (part of
  ``hours`` already) plus ``ablate evaluate``'s scoring of its checkpoints afterwards (not part
  of ``hours``: no attempt ran it). Set by ``ablate compare`` (``with_reference``).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from orchestrator.trial import Attempt

if TYPE_CHECKING:
    from orchestrator.pools import PoolSpec

GPU_HOURS = "gpu_hours"
CPU_HOURS = "cpu_hours"
UNIT_LABEL = {GPU_HOURS: "GPU-h", CPU_HOURS: "CPU-h"}


def pool_rate(pool: PoolSpec) -> tuple[int, str]:
    """(accelerators a trial of ``pool`` holds, unit of its hours)."""
    if pool.kind == "gpu":
        return max(pool.world_size, 1), GPU_HOURS
    if pool.kind == "cpu":
        return max(pool.world_size, 1), CPU_HOURS
    return 1, CPU_HOURS  # a simulator trial runs on one CPU thread (train.threads: 1)


@dataclasses.dataclass(frozen=True)
class TrialCost:
    """Accelerator-hours of one trial over all its attempts (``running``: one still runs)."""

    hours: float
    unit: str
    retry_hours: float = 0.0
    saved_hours: float = 0.0
    steps_run: int = 0
    step_s: float | None = None  # measured wall seconds per step (all attempts)
    running: bool = False
    reference_hours: float = 0.0

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _rate_of(a: Attempt, fallback: PoolSpec | None) -> tuple[int, str]:
    if a.accelerators is not None and a.unit:
        return int(a.accelerators), str(a.unit)
    if fallback is not None:  # attempts recorded before attempts carried their rate
        return pool_rate(fallback)
    return 1, CPU_HOURS


def trial_cost(attempts: Sequence[Attempt], steps: int, *, pools: dict[str, PoolSpec] | None = None,
               now: float | None = None) -> TrialCost | None:
    """The cost of a trial with ``steps`` planned steps from its attempts; None before any
    attempt started. A running attempt counts up to ``now``."""
    started = [a for a in attempts if a.started_at is not None]
    if not started:
        return None
    now = time.time() if now is None else now
    pools = pools or {}
    hours = retry = 0.0
    wall = 0.0
    steps_run = 0
    units: set[str] = set()
    for i, a in enumerate(started):
        n, unit = _rate_of(a, pools.get(a.pool))
        units.add(unit)
        end = a.ended_at
        if end is None:  # still running; or closed unrecorded by a version that kept no end
            end = now if a.outcome is None else (started[i + 1].started_at if i + 1 < len(started)
                                                 else a.started_at)
        seconds = max(end - a.started_at, 0.0)
        ran = max((a.end_step or a.start_step - 1) - a.start_step + 1, 0)
        hours += seconds * n / 3600
        wall += seconds
        steps_run += ran
        if a.outcome == "infra_failure" and i + 1 < len(started):
            kept = max(min(a.end_step or 0, started[i + 1].start_step - 1) - a.start_step + 1, 0)
            per_step = seconds / ran if ran else 0.0
            retry += max(seconds - kept * per_step, 0.0) * n / 3600
    step_s = wall / steps_run if steps_run else None
    last = started[-1]
    saved = 0.0
    if last.outcome == "stopped_early" and step_s is not None and last.end_step is not None:
        n, _ = _rate_of(last, pools.get(last.pool))
        saved = max(steps - last.end_step, 0) * step_s * n / 3600
    unit = units.pop() if len(units) == 1 else "mixed"
    return TrialCost(hours=hours, unit=unit, retry_hours=retry, saved_hours=saved,
                     steps_run=steps_run, step_s=step_s, running=last.outcome is None)


def total(costs: Iterable[TrialCost | None]) -> dict[str, dict[str, float]]:
    """Summed hours, retry hours, saved hours and trial count per unit."""
    out: dict[str, dict[str, float]] = {}
    for c in costs:
        if c is None:
            continue
        t = out.setdefault(c.unit, {"hours": 0.0, "retry_hours": 0.0, "saved_hours": 0.0,
                                    "reference_hours": 0.0, "trials": 0})
        t["hours"] += c.hours
        t["reference_hours"] += c.reference_hours
        t["retry_hours"] += c.retry_hours
        t["saved_hours"] += c.saved_hours
        t["trials"] += 1
    return out


def with_reference(c: TrialCost | None, in_trial_s: float, after_s: float,
                   rate: tuple[int, str] | None = None) -> TrialCost | None:
    """``c`` with the reference evaluator's time: ``in_trial_s`` seconds inside its attempts and
    ``after_s`` seconds of ``ablate evaluate``, at one accelerator (a simulator trial's CPU, the
    fp32 forward of a verl checkpoint), or at ``rate`` (an evaluation job's pool: accelerators
    and unit). A job's hours in another unit than the trial's are not added to its row, which
    has one unit (the job's own record, ``reference.json``, keeps its seconds and rate)."""
    if rate is not None:
        n, unit = rate
        after_s = after_s * n if c is not None and unit == c.unit else 0.0
    if c is None or in_trial_s + after_s <= 0:
        return c
    return dataclasses.replace(c, reference_hours=(in_trial_s + after_s) / 3600)


def fmt_hours(hours: float | None, unit: str) -> str:
    """``1.25 GPU-h``, ``0.00833 CPU-h``: always hours, three significant digits, so the figures
    of one table share a unit and compare at a glance."""
    if hours is None:
        return ""
    label = UNIT_LABEL.get(unit, unit)
    return f"{hours:.3g} {label}"


def cost_tags(c: TrialCost | None) -> dict[str, str]:
    """A trial's cost as MLflow tags of its run (``cost.*``); ``ablate compare`` reads them back."""
    if c is None:
        return {}
    tags = {"cost.unit": c.unit, "cost.accelerator_hours": f"{c.hours:.6g}",
            "cost.retry_hours": f"{c.retry_hours:.6g}",
            "cost.early_stop_saved_hours": f"{c.saved_hours:.6g}", "cost.steps_run": str(c.steps_run)}
    if c.step_s is not None:
        tags["cost.step_s"] = f"{c.step_s:.6g}"
    return tags


def from_tags(tags: dict[str, str]) -> TrialCost | None:
    """The inverse of ``cost_tags`` (None when the run has no cost tags)."""
    try:
        step = tags.get("cost.step_s")
        return TrialCost(hours=float(tags["cost.accelerator_hours"]), unit=tags["cost.unit"],
                         retry_hours=float(tags.get("cost.retry_hours", 0.0)),
                         saved_hours=float(tags.get("cost.early_stop_saved_hours", 0.0)),
                         steps_run=int(tags.get("cost.steps_run", 0)),
                         step_s=float(step) if step else None)
    except (KeyError, ValueError):
        return None


def total_metrics(totals: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per-unit totals as flat MLflow metric names (``cost.gpu_hours``, ``cost.cpu_hours.retry``...)."""
    out: dict[str, float] = {}
    for unit, t in totals.items():
        out[f"cost.{unit}"] = t["hours"]
        out[f"cost.{unit}.retry"] = t["retry_hours"]
        out[f"cost.{unit}.early_stop_saved"] = t["saved_hours"]
    return out
