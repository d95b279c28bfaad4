"""The verdict engine: feeds on a trial's (step, metrics) stream, says when to stop early and,
at the end, how the trial went; ``judge`` replays a whole history through it.

The engine is a pure function of the observed history, so a resumed runner replays the
committed metrics into a fresh engine and gets the same state, and ``compare`` can judge a
stored history again. Apart from the detectors (``_detectors``: one rule each) and the value
(``_value``) because it is the one place that combines them.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from orchestrator import metrics as M
from orchestrator.schema import CollapseSpec, EarlyStopSpec
from orchestrator.verdict._detectors import EarlyWarning, Firing, RuleState
from orchestrator.verdict._rules import resolve_rules
from orchestrator.verdict._value import Verdict, VerdictKind

OUTCOMES = ("completed", "stopped", "numeric_failure", "infra_failure", "cancelled")
# Metrics worth quoting in a verdict, whatever rule fired.
SNAPSHOT_METRICS = (M.EVAL_REWARD, M.TRAIN_REWARD, M.GRAD_NORM, M.K3_KL, M.TRAINING_PPL, M.ENTROPY)


class VerdictEngine:
    """Feeds on (step, metrics) and says when to stop early and, at the end, how the trial went."""

    def __init__(self, collapse: CollapseSpec, early_stop: EarlyStopSpec, total_steps: int,
                 unemitted: Mapping[str, str] | None = None) -> None:
        """``unemitted``: the metrics this trial's configuration never emits, with why (its
        trainer's ``unemitted``). A rule or the early warning on one of them is not applicable
        to the trial: it is not run, and the verdict lists it (``not_applicable``) rather than
        count it among the checks that passed. Plan refuses a grid's own rules on such metrics,
        so these are default rules (e.g. ``fp16_skipped_updates`` for a bf16 learner)."""
        self.collapse = collapse
        self.early_stop = early_stop
        self.total_steps = int(total_steps)
        gone = dict(unemitted or {})
        self.not_applicable = {r.name: f"{r.metric}: {gone[r.metric]}"
                               for r in resolve_rules(collapse) if r.metric in gone}
        self.rules = [RuleState(r) for r in resolve_rules(collapse) if r.metric not in gone]
        wspec = collapse.warning_spec
        if wspec is not None and wspec.metric in gone:
            self.not_applicable["early_warning"] = f"{wspec.metric}: {gone[wspec.metric]}"
            wspec = None
        self.warning = EarlyWarning(wspec) if wspec is not None else None
        self.last_step: int | None = None
        self._snapshots: deque[tuple[int, dict[str, float]]] = deque(maxlen=self._snapshot_depth())
        self._fired_at: dict[str, dict[str, float]] = {}
        self._warn_seen_at: int | None = None
        self._obs_since_warning = 0

    def _snapshot_depth(self) -> int:
        return max([r.spec.patience for r in self.rules] + [1]) + 1

    def observe(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """Take one step's metrics; return a stop reason when early stop applies now, else None.

        Steps at or below the last observed one are ignored (a replay or a re-run step after a
        resume must not count twice).
        """
        if self.last_step is not None and step <= self.last_step:
            return None
        self.last_step = step
        self._snapshots.append((step, {k: float(metrics[k]) for k in SNAPSHOT_METRICS if k in metrics}))
        for rule in self.rules:
            was = rule.firing is not None
            rule.observe(step, metrics)
            if not was and rule.firing is not None:
                self._fired_at[rule.spec.name] = self._snapshot_at(rule.firing.onset)
        if self.warning is not None:
            self.warning.observe(step, metrics)
            if self.warning.step is not None:
                self._obs_since_warning += 1
        return self._stop_reason()

    def _snapshot_at(self, step: int) -> dict[str, float]:
        for s, snap in self._snapshots:
            if s == step:
                return dict(snap)
        return dict(self._snapshots[-1][1]) if self._snapshots else {}

    def _stop_reason(self) -> str | None:
        numeric = self._first(("nonfinite",), verdict=None)
        if numeric is not None:
            return f"non-finite metric at step {numeric.firing.onset}"  # type: ignore[union-attr]
        if not self.early_stop.enabled:
            return None
        margin = self.early_stop.margin
        for rule in self._fired(verdict="collapsed"):
            f = rule.firing
            assert f is not None
            # Certain once the rule has held for ``margin`` observations in a row since it fired.
            if f.held(margin):
                return f"early stop: {rule.spec.name} fired at step {f.onset} ({self._describe(rule)})"
        warned = self.warning is not None and self.warning.step is not None
        if self.early_stop.on_warning and warned and self._obs_since_warning > margin:
            return f"early stop: mismatch early warning at step {self.warning_step} (+{margin} margin)"
        return None

    def _fired(self, verdict: str | None) -> list[RuleState]:
        out = [r for r in self.rules if r.firing is not None and r.spec.kind != "nonfinite"
               and (verdict is None or r.spec.verdict == verdict)]
        return sorted(out, key=lambda r: (r.firing.onset, r.firing.fired))  # type: ignore[union-attr]

    def _first(self, kinds: tuple[str, ...], verdict: str | None) -> RuleState | None:
        rules = [r for r in self.rules if r.firing is not None and r.spec.kind in kinds]
        return min(rules, key=lambda r: r.firing.onset) if rules else None  # type: ignore[union-attr]

    def _describe(self, rule: RuleState, episode: Firing | None = None) -> str:
        f, spec = episode or rule.firing, rule.spec
        assert f is not None
        ref = "" if f.reference is None else f" vs reference {f.reference:.4g}"
        kind = {"explode": f"> {spec.threshold:g}x running median",
                "blowup": f"(rolling median of {spec.window}) > {spec.threshold:g}x its best",
                "drop_from_peak": f"(rolling median of {spec.window}) dropped >= {spec.threshold:.0%} from peak",
                "above": f"> {spec.threshold:g} for {spec.patience} observations",
                "below": f"< {spec.threshold:g} for {spec.patience} observations"}.get(spec.kind, spec.kind)
        floor = f" (and >= {spec.min_delta:g} above it)" if spec.min_delta and spec.kind in ("explode", "blowup") else ""
        if spec.metric == M.SKIPPED_SHARE:
            floor += (" (the fp16 loss scaler skipped the updates of every one of these steps: "
                      "the gradients overflow whatever the scale)")
        return f"{spec.metric} = {f.value:.4g} {kind}{ref}{floor}"

    @property
    def warning_step(self) -> int | None:
        return self.warning.step if self.warning is not None else None

    def verdict(self, last_step: int, outcome: str, reason: str | None = None) -> Verdict:
        """The verdict for a trial that ended at ``last_step`` with ``outcome`` (see OUTCOMES)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        warn = self.warning_step
        stopped = outcome == "stopped" and self._stop_reason() is not None
        saved = max(self.total_steps - int(last_step), 0) if stopped else 0
        common: dict[str, Any] = {"warning_step": warn, "stopped_early": stopped, "steps_saved": saved,
                                  "not_applicable": dict(self.not_applicable)}
        numeric = self._first(("nonfinite",), verdict=None)
        if outcome == "numeric_failure" or numeric is not None:
            step = numeric.firing.onset if numeric is not None else last_step  # type: ignore[union-attr]
            why = reason or f"non-finite metric at step {step}"
            return Verdict(VerdictKind.NUMERIC_FAILURE, step=step, rule="nonfinite", reason=why,
                           values=self._fired_at.get("nonfinite", {}), **self._lead(warn, step), **{
                               k: v for k, v in common.items() if k != "warning_step"})
        collapsed = self._fired("collapsed")
        if collapsed:
            rule = collapsed[0]
            f = rule.firing
            assert f is not None
            values = {**self._fired_at.get(rule.spec.name, {}), rule.spec.metric: f.value}
            if f.reference is not None:
                values["reference"] = f.reference
            why = f"collapsed at step {f.onset}: {rule.spec.name}: {self._describe(rule)}"
            if stopped:
                why += f"; stopped early at step {last_step}, {saved} steps saved"
            return Verdict(VerdictKind.COLLAPSED, step=f.onset, rule=rule.spec.name, reason=why,
                           values=values, **self._lead(warn, f.onset),
                           stopped_early=stopped, steps_saved=saved,
                           not_applicable=dict(self.not_applicable))
        if outcome == "infra_failure":
            return Verdict(VerdictKind.INFRA_FAILURE, step=last_step, reason=reason or "infra failure",
                           **common)
        unstable = [r for r in self.rules if (r.firing is not None or r.episodes)
                    and r.spec.kind != "nonfinite"]
        if unstable:
            unstable.sort(key=lambda r: r.first_onset())
            rule = unstable[0]
            f = rule.firing or rule.episodes[0]
            note = " and recovered" if rule.spec.verdict == "collapsed" else ""
            why = (f"unstable from step {rule.first_onset()}: {rule.spec.name}{note}: "
                   f"{self._describe(rule, f)}")
            if len(unstable) > 1:
                why += "; also fired: " + ", ".join(f"{r.spec.name}@{r.first_onset()}" for r in unstable[1:])
            return Verdict(VerdictKind.UNSTABLE, step=rule.first_onset(), rule=rule.spec.name, reason=why,
                           values={**self._fired_at.get(rule.spec.name, {}), rule.spec.metric: f.value},
                           **common)
        why = "healthy: no collapse rule fired"
        if outcome != "completed":
            why = f"healthy up to step {last_step} ({outcome}{': ' + reason if reason else ''})"
        if self.not_applicable:  # a rule that never ran did not pass
            why += f"; not applicable to this trial: {', '.join(self.not_applicable)}"
        return Verdict(VerdictKind.HEALTHY, reason=why, **common)

    @staticmethod
    def _lead(warn: int | None, step: int | None) -> dict[str, Any]:
        lead = step - warn if warn is not None and step is not None else None
        return {"warning_step": warn, "lead_time": lead}


def judge(history: list[tuple[int, Mapping[str, float]]], collapse: CollapseSpec,
          early_stop: EarlyStopSpec | None = None, total_steps: int | None = None,
          outcome: str = "completed") -> Verdict:
    """Replay a whole metric history and return its verdict (no early stop applied)."""
    steps = total_steps or (history[-1][0] if history else 0)
    engine = VerdictEngine(collapse, early_stop or EarlyStopSpec(enabled=False), steps)
    for step, row in history:
        engine.observe(step, row)
    return engine.verdict(history[-1][0] if history else 0, outcome)
