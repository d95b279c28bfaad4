"""Which trials of a grid a resume or a submission acts on: the trials derived from the planned
ones (rescues and ``ablate resume --set``, read from each ``spec.json``), the rescue tags of the
grid's parent run, and the finished trials ``--failed``/``--collapsed``/``--trial`` select.
Apart from ``_rescue``, which checks and writes what a resume does to them.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from orchestrator.exceptions import UserError, no_such_trial
from orchestrator.grid import notes
from orchestrator.store import TrialPaths, records
from orchestrator.trial import TrialSpec, TrialState

COLLAPSED = ("collapsed", "numeric_failure")  # a NaN blow-up is a collapse for `--collapsed`


def rescue_trials(grid_dir: Path, trial_ids: Iterable[str]) -> list[TrialSpec]:
    """The trials derived from ``trial_ids`` (by a rescue, or ``ablate resume --set``) and
    from those in turn, oldest lineage first: trials of the grid a submission owns beside its
    planned ones (their files repaired and reset, their pools placed, an unfinished one run
    again). Read from each trial's ``spec.json`` (``derived_from``), so a parent's or a
    child's ``state.json`` removed after damage loses no trial."""
    children: dict[str, list[TrialSpec]] = {}
    for spec in records.known_trials(grid_dir).values():
        if spec.derived_from is not None:
            children.setdefault(spec.derived_from[0], []).append(spec)
    seen = set(trial_ids)
    queue, out = list(dict.fromkeys(trial_ids)), []
    while queue:
        for spec in children.get(queue.pop(0), ()):
            if spec.trial_id not in seen:
                seen.add(spec.trial_id)
                out.append(spec)
                queue.append(spec.trial_id)
    return out


def rescue_links(grid_dir: Path) -> dict[str, str]:
    """Tags for the grid's MLflow parent run: ``rescue.<parent>`` names each rescue of a trial
    (the trial it runs as, the event, pool and start step; refusals with their reason)."""
    out = {}
    for tid in records.known_trials(grid_dir):
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        text = [f"{n.get('event')}: refused: {n.get('error')}" if n.get("error") else
                f"{n.get('event')} @{n.get('step')}: {n.get('trial')} on {n.get('pool')} from step {n.get('start')}"
                for n in notes(rec)]
        if text:
            out[f"rescue.{tid}"] = "; ".join(text)[:4000]
    return out


# --------------------------------------------------------------------------- selection


def select_trials(grid_dir: Path, *, select: str | None, trial_ids: Sequence[str]) -> list[TrialSpec]:
    """The trials ``--failed``/``--collapsed``/``--trial`` names; only finished ones qualify."""
    known = records.known_trials(grid_dir)
    grid = Path(grid_dir).name
    if select not in (None, "failed", "collapsed"):
        raise UserError(f"select={select!r}: use 'failed', 'collapsed' or trial ids")
    if select is None and not trial_ids:
        raise UserError("name the trials to resume: --failed, --collapsed or --trial ID")
    for tid in trial_ids:
        if tid not in known:
            raise no_such_trial(tid, known, where=f"grid {grid}", see="see `ablate status`")
    chosen = []
    for tid, spec in known.items():
        rec = records.load_state(TrialPaths(grid_dir, tid), tid)
        kind = (rec.verdict or {}).get("kind")
        if trial_ids:
            if tid not in trial_ids:
                continue
            if not rec.state.is_finished():
                raise UserError(f"grid {grid}: trial {tid} is {rec.state.value}, not finished; "
                                "`ablate resume` continues finished trials (`ablate submit` "
                                "continues unfinished ones)")
        elif not _matches(select, rec.state, kind):
            continue
        chosen.append(spec)
    if not chosen:
        raise UserError(f"grid {grid}: no {select} trials to resume; see `ablate status {grid}`")
    return chosen


def _matches(select: str | None, state: TrialState, kind: str | None) -> bool:
    if select == "failed":
        return state is TrialState.FAILED or kind == "infra_failure"
    return state.is_finished() and kind in COLLAPSED
