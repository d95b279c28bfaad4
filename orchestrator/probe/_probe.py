"""``ablate probe``: the probe of a loaded grid, its report and the submit's preflight (the
package's face, ``orchestrator/probe/__init__.py``, says what a probe is)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from orchestrator.exceptions import GateFailed, UserError
from orchestrator.grid import Gate, GridSpec, load_grid, parse_gate, preflight_gates
from orchestrator.probe._plan import Plan, plan
from orchestrator.probe._report import write
from orchestrator.probe._run import record_spent, run_plan
from orchestrator.probe._summary import Summary, summarise
from orchestrator.store import workspace


@dataclasses.dataclass(frozen=True)
class ProbeReport:
    """What one ``ablate probe`` measured and wrote."""

    plan: Plan
    summaries: tuple[Summary, ...]
    gates: tuple[Gate, ...]
    files: tuple[Path, ...]
    run_id: str | None  # the probe's MLflow run

    @property
    def failed(self) -> list[Summary]:
        return [s for s in self.summaries if s.failed]

    def lines(self) -> list[str]:
        """What the command prints: a line per configuration, one per gate failure, refusals."""
        out = []
        for s in self.summaries:
            k3 = s.metrics["k3"]
            state = "cached" if s.measured.cached else f"probed in {s.measured.seconds:.1f}s"
            bitwise = s.metrics["bitwise_share"].estimate
            out.append(f"{s.label}: k3 {k3.estimate:.3g} [{k3.low:.3g}, {k3.high:.3g}], "
                       f"bitwise equal {f'{bitwise:.3g}' if math.isfinite(bitwise) else 'n/a'} "
                       f"({state})")
        out += [f"{label}: not probed ({why})" for label, why in self.plan.refused]
        for s in self.failed:
            out += [f"GATE FAILED {s.label}: {g.metric} = {s.metrics[g.metric].estimate:.3g}, "
                    f"bound {g}" for g in s.failed]
        if self.files:
            out.append(f"wrote {', '.join(p.name for p in self.files)} to {self.files[0].parent}")
        return out


def probe(grid_path: str, *, pools: Sequence[str] = (), gates: Sequence[str] = (),
          attribute: bool = False, workdir: str | None = None, out: str | None = None,
          tracking_uri: str | None = None, batches: int = 4, seeds: Sequence[int] = (),
          track: bool = True) -> ProbeReport:
    """Probe ``grid_path``'s configurations; every user error (a bad gate, an unknown pool, a
    grid none of whose configurations can be probed) is raised before anything runs."""
    parsed = tuple(parse_gate(g) for g in gates)
    grid = load_grid(grid_path)
    return probe_grid(grid, Path(out) if out else Path("results") / grid.name, pools=pools,
                      gates=parsed, attribute=attribute, workdir=workdir,
                      tracking_uri=tracking_uri, batches=batches, seeds=seeds, track=track)


def probe_grid(grid: GridSpec, out: Path, *, pools: Sequence[str] = (),
               gates: Sequence[Gate] = (), attribute: bool = False, workdir: str | None = None,
               tracking_uri: str | None = None, batches: int = 4, seeds: Sequence[int] = (),
               track: bool = True) -> ProbeReport:
    """``probe`` of a loaded grid, its files written into ``out``."""
    chosen = plan(grid, pools=pools, batches=batches, seeds=seeds)
    if not chosen.configurations:
        whys: dict[str, list[str]] = {}
        for label, w in chosen.refused:
            whys.setdefault(w, []).append(label)
        why = "; ".join(f"{', '.join(labels)}: {w}" for w, labels in whys.items())
        raise UserError(f"{grid.file}: no configuration of grid {grid.name} can be probed ({why})")
    measured = run_plan(chosen, workdir=workdir, attribute=attribute)
    record_spent(workspace.grid_dir(grid.name, workdir), measured)
    summaries = tuple(summarise(measured, gates))
    files = tuple(write(out, chosen, summaries, gates))
    run_id = None
    if track:
        from orchestrator.probe._tracking import log_probe  # deferred: mlflow

        run_id = log_probe(chosen, summaries, files, tracking_uri=tracking_uri, workdir=workdir)
    return ProbeReport(chosen, summaries, tuple(gates), files, run_id)


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What ``ablate submit`` probed before it ran a grid with ``preflight:`` (``submit``)."""

    report: ProbeReport
    on_fail: str  # refuse | skip

    @property
    def skipped(self) -> dict[str, str]:
        """Trial id -> why it is not started (``on_fail: skip``; a refusal starts none)."""
        return {tid: (f"preflight: {g.metric} {s.metrics[g.metric].estimate:.3g} beyond the "
                      f"gate {g} (probe {s.measured.config.probe_id}, {s.label})")
                for s in self.report.failed for g in s.failed[:1]
                for tid in s.measured.config.trials}

    def lines(self) -> list[str]:
        refused = len(self.report.plan.refused)
        ungated = ([f"the trials of the {refused} configuration(s) not probed run ungated"]
                   if refused else [])
        return [f"preflight: {line}" for line in [*self.report.lines(), *ungated]]

    def record(self) -> dict[str, object]:
        """``preflight.json`` in the grid's directory: what was probed and decided."""
        return {"on_fail": self.on_fail, "gates": [str(g) for g in self.report.gates],
                "run_id": self.report.run_id, "files": [p.name for p in self.report.files],
                "configurations": [{"label": s.label, "probe_id": s.measured.config.probe_id,
                                    "trials": list(s.measured.config.trials),
                                    "k3": s.metrics["k3"].estimate,
                                    "failed": [str(g) for g in s.failed]}
                                   for s in self.report.summaries],
                "not_probed": [{"label": label, "why": why} for label, why in
                               self.report.plan.refused],
                "skipped": self.skipped}


def preflight(grid: GridSpec, out: Path, *, workdir: str | None,
              tracking_uri: str | None) -> Preflight | None:
    """The grid's ``preflight:`` probe (None without one, or with ``probe: false``), its files
    in ``out``; with ``on_fail: refuse`` a configuration beyond a gate raises ``GateFailed``
    (one line per configuration, exit 1), nothing trained."""
    spec = grid.spec.preflight
    gates = preflight_gates(grid)
    if spec is None or not spec.probe:
        return None
    done = Preflight(probe_grid(grid, out, gates=gates, workdir=workdir,
                                tracking_uri=tracking_uri), spec.on_fail)
    if done.report.failed and spec.on_fail == "refuse":
        refusal = (f"error: preflight refused grid {grid.name}: {len(done.report.failed)} of "
                   f"{len(done.report.summaries)} configurations beyond the gate, no trial "
                   f"started (report: {out / 'probe.md'}); fix: change the configuration or "
                   f"the gate, or set preflight.on_fail: skip to run the others")
        raise GateFailed([*done.lines(), refusal])
    return done
