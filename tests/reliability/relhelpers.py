"""Helpers of the reliability suite: tiny grids, reading a grid's trial records, and the
invariants every fault test checks (each trial ends exactly once, steps 1..N exactly once on
disk and in MLflow, one live MLflow run per trial)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayclusters import write_grid  # noqa: F401  (re-exported for the suite)
from trialrecords import mlflow_steps, trials

from orchestrator.grid import expand, load_grid
from orchestrator.store import TrialPaths, records, workspace
from orchestrator.trial import TrialSpec

# One sim trial on sim-h100 with the recipe's own config (a grid for hand-written trial files,
# or for commands refused before anything runs).
ONE_TRIAL = """\
name: {name}
recipe: sim/grpo_tiny
backend: sim
steps: {steps}
seeds: [0]
axes:
  pool: [sim-h100]
"""


def one_trial_grid(path: Path, name: str, *, steps: int) -> Path:
    """``ONE_TRIAL`` written to ``path``."""
    path.write_text(ONE_TRIAL.format(name=name, steps=steps))
    return path


def saved_trial(root: Path, name: str, *, steps: int) -> tuple[TrialSpec, TrialPaths]:
    """The one trial of ``root/g.yaml`` (``one_trial_grid``) with its spec saved in the
    workdir, nothing run: the spec and the trial's paths, for a test to write the rest."""
    (t,) = expand(load_grid(one_trial_grid(root / "g.yaml", name, steps=steps)))
    paths = TrialPaths(workspace.grid_dir(name), t.trial_id)
    records.save_spec(paths, t)
    return t, paths


def total_steps(grid_dir: Path) -> int:
    root = Path(grid_dir) / "trials"
    if not root.is_dir():
        return 0
    return sum(sum(1 for _ in records.iter_metrics(p)) for p in root.glob("*/metrics.jsonl"))


def live_runs(uri: str, trial_id: str) -> list[Any]:
    """Active (not soft-deleted) MLflow runs tagged with ``trial_id``, in any experiment."""
    from mlflow.tracking import MlflowClient

    mlc = MlflowClient(uri)
    return [
        r
        for e in mlc.search_experiments()
        for r in mlc.search_runs([e.experiment_id], filter_string=f"tags.trial_id = '{trial_id}'")
    ]


def check_exactly_once(
    grid_dir: Path,
    uri: str,
    *,
    steps: int,
    keys: tuple[str, ...] = ("critic/score/mean",),
    reopened: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Assert the suite's invariants for every trial of a finished grid; returns counts.

    A trial ends exactly once: state ``done`` with a verdict, exactly one attempt with a final
    outcome (completed / stopped_early), every earlier attempt an infra failure with a reason.
    Steps 1..last_step appear exactly once in ``metrics.jsonl`` and in its one live MLflow run,
    whose verdict tag matches the record. A trial in ``reopened`` (its state was rebuilt after
    it had finished) may end a second time, by an attempt that ran no step.
    """
    checked = {"trials": 0, "steps": 0, "mlflow_points": 0, "infra_attempts": 0}
    for tid, t in trials(grid_dir).items():
        rec = t["state"]
        assert rec.state.value == "done", (tid, rec.state, rec.error)
        assert rec.verdict and rec.verdict.get("kind"), (tid, rec.verdict)
        outcomes = [a.outcome for a in t["attempts"]]
        attempts = t["attempts"]
        if (
            tid in reopened
            and len(attempts) > 1
            and attempts[-1].end_step == attempts[-1].start_step - 1
        ):
            attempts = attempts[:-1]  # the replay of the end: no step ran
            outcomes = outcomes[:-1]
        finals = [o for o in outcomes if o in ("completed", "stopped_early")]
        assert len(finals) == 1 and outcomes[-1] == finals[0], (tid, outcomes)
        for a in attempts[:-1]:
            assert a.outcome == "infra_failure" and a.reason, (tid, a)
        last = rec.last_step
        want = list(range(1, last + 1))
        if rec.verdict["kind"] == "healthy":
            assert last == steps, (tid, last)
        assert t["steps"] == want, (tid, t["steps"])
        (run,) = live_runs(uri, tid)  # one live run per trial, the one the record names
        assert run.info.run_id == rec.mlflow_run_id
        assert run.data.tags.get("verdict") == rec.verdict["kind"], (tid, run.data.tags)
        for key in keys:
            assert mlflow_steps(uri, run.info.run_id, key) == want, (tid, key)
            checked["mlflow_points"] += len(want)
        checked["trials"] += 1
        checked["steps"] += last
        checked["infra_attempts"] += len(outcomes) - 1
    return checked


def refused_in_one_line(capsys: Any, argv: list[str], *, within: float,
                        expected_warnings: tuple[str, ...] = ()) -> str:
    """Run ``ablate argv`` in this process: exit 2, one ``error:`` line on stderr, no traceback,
    within ``within`` seconds (before anything slow starts); returns the line. A ``warning:``
    line containing one of ``expected_warnings`` (e.g. a GPU grid's engine not installed here)
    may come before it; any other extra line fails."""
    import time

    from orchestrator.cli import main

    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(argv)
    out, err = capsys.readouterr()
    err = "".join(line for line in err.splitlines(keepends=True)
                  if not (line.startswith("warning: ") and any(w in line for w in expected_warnings)))
    assert rc == 2, (argv, out, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in out + err, err
    assert time.monotonic() - t0 < within, argv
    return err
