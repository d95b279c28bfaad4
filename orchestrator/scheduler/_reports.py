"""What ``submit`` and ``resume`` return: typed reports the CLI formats (``EvaluateReport`` is
``ablate evaluate``'s). Each is also its JSON document as a read-only mapping, the form
``ablate submit --json`` prints and the event stream's summary carries; its typed fields are read
from that one document, so the two never differ."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any


class _Document(Mapping[str, Any]):
    """A report's JSON document (``json``), read-only, as a mapping."""

    json: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.json[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.json)

    def __len__(self) -> int:
        return len(self.json)

    def to_json(self) -> dict[str, Any]:
        return dict(self.json)


@dataclasses.dataclass(frozen=True, eq=False)
class SubmitReport(_Document):
    """One submission of a grid: counts by state and verdict over its trials (rescues
    included), the trials that failed for good and the ones it did not finish, and the rest of
    its summary (cost, budget, adaptive seeds, the search's best point, where it ran)."""

    json: Mapping[str, Any]

    @property
    def grid(self) -> str:
        return str(self.json.get("grid"))

    @property
    def states(self) -> Mapping[str, int]:
        return self.json.get("states") or {}

    @property
    def verdicts(self) -> Mapping[str, int]:
        return self.json.get("verdicts") or {}

    @property
    def failed(self) -> list[Mapping[str, Any]]:
        """Trials that failed for good (their retries spent): each its id and reason."""
        return list(self.json.get("failed") or [])


@dataclasses.dataclass(frozen=True)
class Resumed:
    """One trial ``ablate resume`` ran on: where from, and the verdict it ended with."""

    trial_id: str
    parent: str
    pool: str
    from_step: int
    derived: bool
    verdict: str  # its verdict's kind, "?" where it has none


@dataclasses.dataclass(frozen=True, eq=False)
class ResumeReport(_Document):
    """One ``ablate resume``: the trials it ran and the ones whose attempt never started
    (each kept its finished record, with why)."""

    json: Mapping[str, Any]

    @property
    def resumed(self) -> list[Resumed]:
        results = self.json.get("results") or {}
        out = []
        for r in self.json.get("resumed") or []:
            verdict = (results.get(r["trial_id"]) or {}).get("verdict")
            kind = verdict.get("kind", "?") if isinstance(verdict, Mapping) else verdict or "?"
            out.append(Resumed(r["trial_id"], r["parent"], r["pool"], int(r["from_step"]),
                               bool(r["derived"]), str(kind)))
        return out

    @property
    def not_resumed(self) -> Mapping[str, str]:
        return self.json.get("not_resumed") or {}
