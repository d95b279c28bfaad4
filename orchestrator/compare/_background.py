"""Work of ``ablate compare`` done in a forked child while the parent goes on.

A 1,000-trial compare spends most of its report on three independent pieces: the curve plots,
the fANOVA forests and everything else (tables, intervals, the other plots). On a machine with
two CPUs or more each piece past ``CHILD_FROM`` trials can run in its own forked child: the
child inherits the parent's data (nothing is pickled on the way in), and sends back only its
return value through a pipe. If a child fails, the parent runs the piece itself, so an error
surfaces as it would without children, and the output does not depend on where it ran.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
CHILD_FROM = 200  # trials from which a piece runs in a child (below, forking costs more than it saves)
# How long the parent waits for a child's value: a child that deadlocks after the fork (a lock
# some other thread held when it was taken) is killed and its piece redone in the parent, so a
# compare never hangs on it. Far above the seconds the pieces take at 5,000 trials.
CHILD_TIMEOUT_S = 600.0


def start(fn: Callable[[], T], *, trials: int) -> Callable[[], T]:
    """Start ``fn``; returns a function that waits for it and returns its value."""
    if (trials < CHILD_FROM or (os.cpu_count() or 1) < 2
            or "fork" not in multiprocessing.get_all_start_methods()):
        value = fn()
        return lambda: value
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(fn, send), daemon=True)
    child.start()
    send.close()  # the parent's copy: recv() then ends with EOFError if the child dies

    def wait() -> T:
        ok = False
        try:
            if receive.poll(CHILD_TIMEOUT_S):
                value, ok = receive.recv(), True  # before join: a large value would block the child
        except EOFError:
            pass
        finally:
            receive.close()
        if not ok and child.is_alive():
            child.kill()
        child.join()
        return value if ok and child.exitcode == 0 else fn()
    return wait


def _child(fn: Callable[[], Any], send: Any) -> None:
    try:
        send.send(fn())
    except Exception:  # noqa: BLE001 - silent: the parent runs ``fn`` again and reports the error
        os._exit(1)
    send.close()
