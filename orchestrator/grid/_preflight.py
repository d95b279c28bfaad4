"""A probe's pass/fail bounds, ``METRIC<=BOUND`` or ``METRIC>=BOUND``: ``ablate probe --gate``
and a grid's ``preflight.gate`` (what ``ablate submit`` probes first) are parsed by the one
function here, and a grid's are checked at plan with the rest of the grid.
"""
from __future__ import annotations

import dataclasses
import math
import re

from orchestrator import metrics as M
from orchestrator.exceptions import UserError, did_you_mean
from orchestrator.grid._spec import GridSpec

_GATE = re.compile(r"^\s*([\w./\-]+)\s*(<=|>=)\s*(\S+)\s*$")


@dataclasses.dataclass(frozen=True)
class Gate:
    """``METRIC<=BOUND`` (or ``>=``): a configuration whose estimate is beyond fails."""

    metric: str  # a key of metrics.PROBE_METRICS
    op: str
    bound: float

    def fails(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        return value > self.bound if self.op == "<=" else value < self.bound

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def _gate(name: str, op: str, raw: str) -> Gate | str:
    """The gate, or what is wrong with it (one clause)."""
    by_vocab = {v: k for k, v in M.PROBE_METRICS.items()}
    metric = name if name in M.PROBE_METRICS else by_vocab.get(name)
    if metric is None:
        hint = did_you_mean(name, list(M.PROBE_METRICS))
        return (f"unknown metric {name!r}; allowed: {', '.join(M.PROBE_METRICS)}"
                + (f"; did you mean {hint}?" if hint else ""))
    try:
        bound = float(raw)
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound):
        return f"the bound {raw!r} is not a finite number"
    return Gate(metric, op, bound)


def parse_gate(text: str, where: str = "--gate") -> Gate:
    """One ``--gate`` value; a malformed one, an unknown metric or a bound that is not a
    number is a one-line UserError."""
    m = _GATE.match(text)
    if not m:
        raise UserError(f"{where} {text!r}: expected METRIC<=BOUND (or METRIC>=BOUND), e.g. "
                        "k3<=0.01")
    gate = _gate(*m.groups())
    if isinstance(gate, str):
        raise UserError(f"{where} {text!r}: {gate}")
    return gate


def preflight_gates(grid: GridSpec) -> tuple[Gate, ...]:
    """The grid's ``preflight.gate`` (``{k3: 0.01}``: at most; ``{bitwise_share: ">=0.9"}``), a
    bad one a one-line GridError at its line; () without a preflight."""
    spec = grid.spec.preflight
    if spec is None:
        return ()
    if grid.spec.search is not None:
        raise grid.error("a search grid has no configurations to probe before it runs (its "
                         "trials are the points the search samples)", "preflight",
                         fix="probe its pools with `ablate probe` on a grid with the same "
                             "settings, or remove preflight:")
    gates = []
    for name, bound in spec.gate.items():
        raw = str(bound).strip()
        op = raw[:2] if raw[:2] in ("<=", ">=") else "<="
        gate = _gate(name, op, raw.removeprefix(op).strip())
        if isinstance(gate, str):
            raise grid.error(gate, "preflight", "gate", name,
                             fix='e.g. gate: {k3: 0.01, bitwise_share: ">=0.9"}')
        gates.append(gate)
    return tuple(gates)
