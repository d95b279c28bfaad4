"""The verdict as a value: its kinds, its JSON form and its MLflow tags.

Apart from the rules and the engine that reach a verdict because everything that only reads
one (tracking, the trial records, ``compare``) needs this and nothing else.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from typing import Any


class VerdictKind(enum.Enum):
    HEALTHY = "healthy"
    COLLAPSED = "collapsed"
    UNSTABLE = "unstable"
    NUMERIC_FAILURE = "numeric_failure"
    INFRA_FAILURE = "infra_failure"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How a trial went. ``lead_time`` = collapse step - warning step (negative: warning came late)."""

    kind: VerdictKind
    step: int | None = None
    rule: str | None = None
    reason: str = ""
    values: Mapping[str, float] = dataclasses.field(default_factory=dict)
    warning_step: int | None = None
    lead_time: int | None = None
    stopped_early: bool = False
    steps_saved: int = 0
    # Rules (and the early warning) this trial's configuration gives no metric for, with why:
    # never run, so never counted as passed (``VerdictEngine``).
    not_applicable: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        data["values"] = {k: _json_float(v) for k, v in self.values.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in fields}
        kw["kind"] = VerdictKind(data["kind"])
        kw["values"] = {k: float(v) for k, v in (data.get("values") or {}).items()}
        kw["not_applicable"] = {str(k): str(v) for k, v in (data.get("not_applicable") or {}).items()}
        return cls(**kw)

    def tags(self) -> dict[str, str]:
        """MLflow tags (strings only; absent fields are empty strings so a rerun overwrites them)."""
        tags = {
            "verdict": self.kind.value,
            "verdict.step": "" if self.step is None else str(self.step),
            "verdict.rule": self.rule or "",
            "verdict.reason": self.reason[:4000],
            "verdict.warning_step": "" if self.warning_step is None else str(self.warning_step),
            "verdict.lead_time": "" if self.lead_time is None else str(self.lead_time),
            "verdict.stopped_early": str(self.stopped_early).lower(),
            "verdict.steps_saved": str(self.steps_saved),
            "verdict.not_applicable": (json.dumps(dict(self.not_applicable), sort_keys=True)
                                       if self.not_applicable else ""),
        }
        for key, value in self.values.items():
            tags[f"verdict.value.{key}"] = f"{value:.6g}"
        return tags


def _json_float(v: float) -> float | str:
    return v if math.isfinite(v) else repr(float(v))
