"""The detectors that follow one rule (or the early warning) over a metric stream.

A rule *fires* once its condition has held for ``patience`` consecutive observations; the
firing's onset is the first of those. Ratios to a running statistic get absolute floors:
``min_delta`` (a grad norm 10x a median near 0 is an ordinary gradient after an entropy
collapse) and, for reward drops, a noise floor (half of a near-zero peak is within the noise of
a run that never learned). A fired rule recovers once it is back past the recovery threshold
(``HYSTERESIS``) for ``RECOVERY_OBS`` observations. Apart from the engine (``_engine``), which
combines the detectors into early stop and a verdict.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Mapping

from orchestrator import metrics as M
from orchestrator.schema import CollapseRuleSpec, EarlyWarningSpec

# A loss-scaled (fp16) learner skips an update whose gradients overflowed and logs the
# non-finite grad norm of that step (verl 0.9.1 workers/engine/fsdp/transformer_impl.py:798-834):
# on a row whose SKIPPED_SHARE says updates were skipped, these are a skipped update, not a numeric
# failure (persistent skips have their own rule: _rules.fp16_skipped_updates).
SKIP_EXCUSED = frozenset({M.GRAD_NORM})
RECOVERY_OBS = 5  # a fired rule must be clear for this many final observations to count as recovered
# Hysteresis: a fired ratio rule is clear only once its value is back within this share of the
# threshold's distance from its reference (a reward that fell 50% from its peak has recovered when
# it is within 25% of the peak, not at a 45% drop; a 10x grad norm once below 5.5x its median).
HYSTERESIS = 0.5
# drop_from_peak also needs the drop to exceed NOISE_SIGMAS x the raw series' noise (a robust sigma
# from its last NOISE_OBS successive differences; no drop counts before NOISE_MIN_OBS of them).
NOISE_SIGMAS = 4.0
NOISE_OBS = 50
NOISE_MIN_OBS = 5


@dataclasses.dataclass
class Firing:
    """One episode of a fired rule: where it began, what it fired on, and how it has held since."""

    onset: int  # first step of the run of observations that made the rule fire
    fired: int  # step at which it fired (onset + patience - 1 observations)
    value: float
    reference: float | None
    clear_streak: int = 0  # consecutive observations since firing past the recovery threshold
    active_since_fire: int = 0  # consecutive observations, up to now, with the condition true
    holding: bool = True  # the condition held at the latest observation

    def held(self, n: int) -> bool:
        """The condition has held for the last ``n`` observations since firing (and holds now)."""
        return self.active_since_fire >= n and self.holding


class Streak:
    """Consecutive observations with a condition true, and the step where that run began."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.count = 0
        self.start: int | None = None

    def update(self, step: int, cond: bool) -> int | None:
        """Count one observation; the onset step once ``patience`` are in a row, else None."""
        if not cond:
            self.reset()
            return None
        if self.count == 0:
            self.start = step
        self.count += 1
        return self.start if self.count >= self.patience else None

    def reset(self) -> None:
        self.count, self.start = 0, None


def skipped(metrics: Mapping[str, float]) -> bool:
    """The row records updates the loss scaler skipped (``fp16/skipped_share`` > 0)."""
    share = metrics.get(M.SKIPPED_SHARE)
    return share is not None and math.isfinite(share) and share > 0


def excused(name: str, metrics: Mapping[str, float]) -> bool:
    """A non-finite ``name`` on this row is a skipped update, not a numeric failure: the loss
    scaler skipped the step's update (:func:`skipped`) and ``name`` is what such a step logs
    non-finite (:data:`SKIP_EXCUSED`). The nonfinite rule and the simulator's trial loop
    (``sim/job.py``) both ask it, so neither ends a trial the other would excuse."""
    return name in SKIP_EXCUSED and skipped(metrics)


class RuleState:
    """Incremental state of one rule: its reference statistic and its current streak."""

    def __init__(self, spec: CollapseRuleSpec) -> None:
        self.spec = spec
        self.history: deque[float] = deque(maxlen=max(spec.window, 1))  # raw, for explode
        self.smooth: deque[float] = deque(maxlen=max(spec.window, 1))  # for blowup/drop
        self.best: float | None = None  # running peak (drop) or running min (blowup)
        self.diffs: deque[float] = deque(maxlen=NOISE_OBS)  # |successive differences|, raw
        self.last_raw: float | None = None
        self.noise: float | None = None  # robust sigma of the raw series (drop_from_peak)
        self.streak = Streak(spec.patience)
        self.firing: Firing | None = None  # the current episode
        self.episodes: list[Firing] = []  # earlier episodes the trial recovered from

    def observe(self, step: int, metrics: Mapping[str, float]) -> None:
        spec = self.spec
        if spec.kind == "nonfinite":
            bad = [k for k, v in metrics.items() if (spec.metric in ("*", k)) and not math.isfinite(v)
                   and not excused(k, metrics)]
            self._update(step, bool(bad), bool(bad), float("nan") if bad else 0.0, None)
            return
        if spec.metric not in metrics:
            return
        value = float(metrics[spec.metric])
        if not math.isfinite(value):
            return  # the nonfinite rule owns this case
        smoothed = spec.kind in ("blowup", "drop_from_peak")
        if spec.kind == "drop_from_peak":
            self._track_noise(value)
        if smoothed:
            # A rolling median: one wild value (a single PPL spike) must not fire a patient rule.
            self.smooth.append(value)
            value = statistics.median(self.smooth)
        if self.firing is not None and smoothed:
            # After firing, judge recovery against the reference frozen at the firing.
            ref = self.firing.reference
            self._track_after_fire(self._condition(value, ref), self._condition(value, ref, relax=True))
            return
        cond, held, ref = self._evaluate(step, value)
        self._update(step, cond, held, value, ref)

    def _track_noise(self, raw: float) -> None:
        """Noise of the series before this value: 1.4826 x the median |successive difference| /
        sqrt(2) is sigma for Gaussian noise, and a collapse's few large jumps barely move it."""
        if len(self.diffs) >= NOISE_MIN_OBS:
            self.noise = 1.4826 * statistics.median(self.diffs) / math.sqrt(2)
        if self.last_raw is not None:
            self.diffs.append(abs(raw - self.last_raw))
        self.last_raw = raw

    def _evaluate(self, step: int, value: float) -> tuple[bool, bool, float | None]:
        """Condition, relaxed condition (a fired rule's recovery test, see ``_condition``) and
        reference for ``value`` (already the rolling median for smoothed kinds)."""
        spec = self.spec
        eligible = step >= spec.min_step
        if spec.kind == "explode":
            enough = len(self.history) >= min(spec.window, 5)
            ref = statistics.median(self.history) if enough else None
            cond = eligible and ref is not None and self._condition(value, ref)
            held = eligible and ref is not None and self._condition(value, ref, relax=True)
            # Exploded values stay out of the reference so a sustained explosion stays visible.
            if not cond:
                self.history.append(value)
            return cond, held, ref
        if spec.kind in ("blowup", "drop_from_peak"):
            full = len(self.smooth) == self.smooth.maxlen
            ref = self.best
            cond = eligible and full and ref is not None and self._condition(value, ref)
            if full and not cond:
                better = (lambda a, b: a > b) if spec.kind == "drop_from_peak" else (lambda a, b: a < b)
                if self.best is None or better(value, self.best):
                    self.best = value
            return cond, cond, ref
        cond = eligible and self._condition(value, None)
        return cond, cond, None

    def _condition(self, value: float, ref: float | None, relax: bool = False) -> bool:
        """The rule's condition; ``relax`` (a fired ratio rule's recovery test) halves the
        distance of its threshold from "no change" (hysteresis: see HYSTERESIS)."""
        spec, thr = self.spec, float(self.spec.threshold)
        if spec.kind == "above":
            return value > thr
        if spec.kind == "below":
            return value < thr
        if ref is None:
            return False
        if spec.kind in ("explode", "blowup"):
            # A ratio to a reference near 0 is huge for any ordinary value: min_delta is the
            # absolute rise the value must also have over its reference.
            ratio = 1.0 + (thr - 1.0) * HYSTERESIS if relax else thr
            return value > ratio * max(ref, 1e-12) and value - ref >= float(spec.min_delta)
        if spec.kind == "drop_from_peak":
            drop = ref - value
            thr = thr * HYSTERESIS if relax else thr
            # min_delta and the noise floor: a reward whose peak sits near 0 loses "half of it"
            # in any dip; only a drop well beyond the series' own noise is a collapse.
            return (drop >= thr * abs(ref) and drop >= float(spec.min_delta) and drop > 0
                    and self.noise is not None and drop >= NOISE_SIGMAS * self.noise)
        return False

    def _update(self, step: int, cond: bool, held: bool, value: float, ref: float | None) -> None:
        if self.firing is not None:
            self._track_after_fire(cond, held)
            return
        onset = self.streak.update(step, cond)
        if onset is not None:
            self.firing = Firing(onset=onset, fired=step, value=value, reference=ref)

    def _track_after_fire(self, cond: bool, held: bool) -> None:
        """One observation of a fired rule: ``cond`` counts toward early stop, ``held`` (the
        relaxed condition) decides whether it is recovering."""
        f = self.firing
        assert f is not None
        f.holding = cond
        f.active_since_fire = f.active_since_fire + 1 if cond else 0
        if held:
            f.clear_streak = 0
            return
        f.clear_streak += 1
        if f.clear_streak >= max(RECOVERY_OBS, self.spec.patience) and self.spec.kind != "nonfinite":
            # Recovered: remember the episode and re-arm, so a later relapse is judged (and can
            # stop the trial) on its own, not on the count of an old episode.
            self.episodes.append(f)
            self.firing = None
            self.streak.reset()

    def recovered(self) -> bool:
        """Fired before, and not in an episode now."""
        return self.firing is None and bool(self.episodes)

    def first_onset(self) -> int:
        starts = [e.onset for e in self.episodes] + ([self.firing.onset] if self.firing else [])
        return min(starts)


class EarlyWarning:
    """Mismatch trend detector (seeds 000/002: k3 rises before grad norm and PPL blow up)."""

    def __init__(self, spec: EarlyWarningSpec) -> None:
        self.spec = spec
        self.values: deque[float] = deque(maxlen=spec.lag + spec.window * 4)
        self.streak = Streak(spec.patience)
        self.step: int | None = None  # onset of the first warning

    def observe(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.step is not None or self.spec.metric not in metrics:
            return
        value = float(metrics[self.spec.metric])
        if not math.isfinite(value):
            return
        self.values.append(value)
        vals = list(self.values)
        w = self.spec.window
        if step < self.spec.min_step or len(vals) < self.spec.lag + w:
            return
        recent = statistics.median(vals[-w:])
        # The reference window ends ``lag`` observations back, so a slow healthy drift (k3 grows
        # ~100x from init to trained in the simulator probe) does not trigger it, a fast rise does.
        ref_vals = vals[: len(vals) - self.spec.lag]
        reference = statistics.median(ref_vals[-w * 4:])
        rising = recent >= float(self.spec.floor) and recent > float(self.spec.ratio) * max(reference, 1e-30)
        self.step = self.streak.update(step, rising)
