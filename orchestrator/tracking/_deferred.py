"""MLflow writes of short attempts, moved out of the trial slot into the orchestrator process.

Creating a child run, logging its params, tags, metrics and artifacts and finishing it costs a
trial about half a second of SQLite transactions, plus a 4-11 s ``import mlflow`` in every fresh
Ray worker. For a trial of a few seconds that doubles its slot time. So an attempt starts
*deferred*: its runner writes everything into the trial's durable outbox (``_outbox.Outbox``, the
same files a store outage fills) through a :class:`DeferredRun` and never touches MLflow; when
Tune reports the trial complete, the orchestrator's ``Sender`` thread (``_sender``) creates the
run if needed, sends the outbox and records the run id in ``state.json``. An attempt still
running after ``DeferredRun.LIVE_AFTER_S`` switches to a live ``TrialRun`` at its next checkpoint, so long
trials show up in MLflow while they run.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

from orchestrator.tracking._outbox import Outbox
from orchestrator.tracking._runs import TrialRun
from orchestrator.trial import TrialSpec


class DeferredRun(TrialRun):
    """A ``TrialRun`` that only fills its outbox: no MLflow import, no store round trips."""

    LIVE_AFTER_S: ClassVar[float] = 30.0  # older attempts go live at their next checkpoint

    def __init__(self, trial: TrialSpec, buffer: Path, run_id: str | None = None) -> None:
        self.trial = trial
        outbox = Outbox(buffer)
        if run_id is not None and outbox.run_id is None:  # the buffer went; the run did not
            outbox.run_id = run_id
            outbox.save_state()
        self._bind("", "", None, outbox, next_try=math.inf)  # never sends from the worker

    def _pump(self) -> None:
        """Nothing is sent from the worker; the orchestrator's Sender does it."""

    def flush(self, timeout: float = 30) -> bool:
        return False

    def end(self, status: str = "FINISHED", timeout: float = 30) -> bool:
        self.outbox.set_end(status)
        return False
