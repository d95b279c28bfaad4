"""A grid's rescue policy: the ordered ``rescue:`` list (``on_collapse:`` is its one-entry
form), checked at plan time, and which entry applies to one trial and one event.

An event is ``collapsed``, ``infra_failed`` (retries spent) or ``warning:RULE``. The first entry
for the event that still may act takes it: an entry rescues one trial at most ``times`` times,
and a trial that is itself a rescue (derived by one, or resumed in place by another entry) only
when the entry says ``of_rescues: true``. What happened is kept in the trial's ``state.json``
(``rescues``: one note per rescue or refusal), written in the same write as the request, so a
killed submission that is submitted again finds every rescue it made. A refusal for budget is
kept but does not count: a submission with a larger budget rescues the trial then. The bound is
over a lineage: a trial derived by a rescue carries the counted notes of its ancestors
(``rescue_of["lineage"]``, ``lineage``), so ``times`` bounds the rescues of a trial and of every
trial derived from it, not each derived trial afresh.

Here rather than in the scheduler because the runner asks it too: a trial stops on a warning
only when an entry would rescue it (``warning_stops``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.grid._checker import Checker
from orchestrator.pools import PoolCatalog
from orchestrator.safeyaml import format_path
from orchestrator.schema import GridFile, RescueEntry
from orchestrator.store import records
from orchestrator.verdict import resolve_rules

if TYPE_CHECKING:
    from orchestrator.backends import Backend

EARLY_WARNING = "early_warning"  # the name of the trend detector (``collapse.early_warning``)
BUDGET_REFUSAL = "budget"  # a note's ``refused`` value that does not count against ``times``


def entry_paths(spec: GridFile) -> list[tuple[RescueEntry, tuple[Any, ...]]]:
    """Each entry with the grid key path it was written under (for errors and line numbers)."""
    if spec.on_collapse is not None:
        return [(e, ("on_collapse",)) for e in spec.rescue_policy]
    return [(e, ("rescue", i)) for i, e in enumerate(spec.rescue_policy)]


def notes(rec: records.TrialRecord) -> list[dict[str, Any]]:
    """The trial's rescue notes, oldest first (a record from before the list: its one note)."""
    if rec.rescues:
        return list(rec.rescues)
    if rec.rescue is not None:
        return [{"event": "collapsed", "entry": 0, **rec.rescue}]
    return []


def lineage(rec: records.TrialRecord) -> list[dict[str, Any]]:
    """The counted rescue notes of ``rec``'s trial and of its ancestors, oldest first: what a
    trial derived from it now inherits (``rescue_of["lineage"]``)."""
    inherited = list((rec.rescue_of or {}).get("lineage") or ())
    return inherited + [{k: n.get(k) for k in ("entry", "event", "step", "trial")}
                        for n in notes(rec) if n.get("refused") != BUDGET_REFUSAL]


def entry_for(policy: Sequence[RescueEntry], event: str,
              rec: records.TrialRecord) -> tuple[int, RescueEntry] | None:
    """The entry that rescues ``rec``'s trial on ``event`` now, with its index, or None."""
    had = notes(rec)
    counted = lineage(rec)
    for i, entry in enumerate(policy):
        if entry.event != event:
            continue
        mine = [n for n in counted if n.get("entry", 0) == i]
        if len(mine) >= entry.times:
            continue
        other = [n for n in had if n.get("entry", 0) != i and n.get("trial") == rec.trial_id]
        if (rec.rescue_of is not None or other) and not entry.of_rescues:
            continue
        return i, entry
    return None


def warning_stops(policy: Sequence[RescueEntry], rec: records.TrialRecord) -> frozenset[str]:
    """The warnings that stop this trial: those an entry would rescue it on."""
    return frozenset(e.warning for e in policy
                     if e.warning is not None and entry_for(policy, e.event, rec) is not None)


# Keys a resume from a checkpoint cannot change: the checkpoint holds the model's weights, and
# these set their shapes (verl: the model it loads). The simulator's parameters
# (``sim/model.py: init_params``, :43-64) are shaped by the architecture (``arch``: dense or
# MoE), ``d_model``, ``d_ff``, ``n_layers``, ``n_experts`` and ``expert_d_ff``, and its
# embeddings by the task's vocabulary and sequence length (``sim/job.py:136`` builds the model
# with ``vocab=task.vocab, max_len=task.seq_len``; ``sim/task.py:61-66``: ``digits + 2 +
# response_len``). ``model.n_heads``, ``model.top_k`` and ``model.aux_loss_coef`` shape no
# weight: a resume may change them.
RESUME_FIXED = ("model.arch", "model.d_model", "model.d_ff", "model.n_layers", "model.n_experts",
                "model.expert_d_ff", "task.vocab", "task.digits", "task.response_len",
                "actor_rollout_ref.model.path")


def fixed_on_resume(key: str) -> str | None:
    """Why a resume (a rescue's ``set:``, ``ablate resume --set``) cannot change ``key``."""
    if key.lstrip("+") in RESUME_FIXED:
        return (f"{key} cannot change on a resume: the checkpoint it starts from holds the "
                "model's weights, whose shapes it sets (a new value would not fit them)")
    return None


def check_policy(spec: GridFile, chk: Checker, catalog: PoolCatalog, runs: Backend) -> None:
    """Plan-time checks of every entry: its pool (known, of a kind the trainer runs), its
    ``set:`` keys and values, its warning rule."""
    for entry, path in entry_paths(spec):
        act = entry.resume
        if act.pool is not None:
            catalog.get(act.pool, file=chk.file, line=chk.lines.get((*path, "resume", "pool")),
                        key=format_path((*path, "resume", "pool")))
            kind = catalog.pools[act.pool].kind
            if kind not in runs.pool_kinds:
                ok = [p for p in catalog.names() if catalog.pools[p].kind in runs.pool_kinds]
                raise chk.err(f"pool {act.pool!r} is a {kind} pool; backend {spec.backend!r} "
                              f"runs on {' and '.join(runs.pool_kinds)} pools",
                              (*path, "resume", "pool"), allowed=ok)
        for k, v in act.set.items():
            chk.value(k, v, (*path, "resume", "set", k))  # a bad value first: the sharper error
            why = fixed_on_resume(k)
            if why is not None:
                raise chk.err(why, (*path, "resume", "set", k),
                              fix="make it an axis of the grid (its trials train from scratch)")
        if entry.warning is not None:
            _check_warning(spec, entry.warning, chk, (*path, "when", "warning"))


def _check_warning(spec: GridFile, name: str, chk: Checker, path: tuple[Any, ...]) -> None:
    rules = {r.name: r for r in resolve_rules(spec.collapse)}
    warnings = [n for n, r in rules.items() if r.verdict == "unstable"]
    if spec.collapse.warning_spec is not None:
        warnings.insert(0, EARLY_WARNING)
    if name in warnings:
        if name in rules:
            _check_reach(spec, rules[name].patience, name, chk, path)
        return
    if name == EARLY_WARNING:
        raise chk.err("the early warning is switched off (collapse.early_warning: false)", path,
                      fix="switch it on, or name a collapse rule with verdict: unstable")
    if name in rules:
        raise chk.err(f"rule {name!r} judges a collapse, not a warning", path,
                      fix="use 'when: collapsed' for it, or give the rule verdict: unstable")
    raise chk.err(f"unknown warning rule {name!r}", path, allowed=warnings or ["(none)"], got=name,
                  fix="name the early warning or a collapse rule with verdict: unstable")


def _check_reach(spec: GridFile, patience: int, name: str, chk: Checker,
                 path: tuple[Any, ...]) -> None:
    """A warning rescue starts from the newest checkpoint at or before the warning's onset,
    which the rule fires ``patience - 1`` steps after: refused when the grid's checkpoints can
    never hold one then (each trial would stop for a rescue that is refused at run time)."""
    ck = spec.checkpoint
    latest = spec.steps - patience + 1  # the latest onset that fires within the trial's steps
    if ck.every > latest:
        raise chk.err(f"warning {name!r} (patience {patience}) has its onset at step {latest} at "
                      f"the latest, before the first checkpoint (checkpoint.every {ck.every}): "
                      "this entry can never act", path,
                      fix=f"a checkpoint.every of at most {max(latest, 1)}")
    if ck.every * ck.keep < patience:
        raise chk.err(f"warning {name!r} fires {patience - 1} step(s) after its onset, when the "
                      f"{ck.keep} checkpoint(s) kept every {ck.every} step(s) are all after it: "
                      "this entry can never act", path,
                      fix=f"checkpoint.keep: {-(-patience // ck.every)} or more, or a smaller "
                          "patience")


def set_keys(spec: GridFile) -> Mapping[str, tuple[Any, ...]]:
    """Every key a rescue entry sets, with the path of its first mention."""
    out: dict[str, tuple[Any, ...]] = {}
    for entry, path in entry_paths(spec):
        for key in entry.resume.set:
            out.setdefault(key, (*path, "resume", "set", key))
    return out


def pool_paths(spec: GridFile) -> Mapping[str, tuple[Any, ...]]:
    """Every pool a rescue entry moves to, with the path of its first mention."""
    out: dict[str, tuple[Any, ...]] = {}
    for entry, path in entry_paths(spec):
        if entry.resume.pool is not None:
            out.setdefault(entry.resume.pool, (*path, "resume", "pool"))
    return out
