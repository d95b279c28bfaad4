"""Shared fixtures. Tests run from any cwd; state goes to tmp dirs, never the repo."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sim import numerics

# Before anything imports torch: every simulator number a test checks (the golden run, the
# calibration bounds) holds on any x86-64 AVX2 machine only under the pinned numerics, and the
# Ray workers and `ablate` subprocesses the tests start inherit them.
assert "torch" not in sys.modules, "torch was imported before tests/conftest.py pinned numerics"
numerics.apply(True)

REPO = Path(__file__).resolve().parent.parent
# compare's cache of plots and importance (orchestrator/compare/_cache.py) carries no result from
# one test into another; tests/compare/test_compare_cache.py turns it on in a tmp dir.
os.environ.setdefault("ABLATE_CACHE_DIR", "off")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp cwd with its own workdir and tracking store; recipes still resolve to the repo's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_WORKDIR", str(tmp_path / ".ablate"))
    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a non-interactive shell (`pytest ... &`, as a CI
    # wrapper may) inherits SIGINT ignored, and every command a test starts would inherit that
    # too: the tests that send Ctrl-C's SIGINT (`ablate ui`, an interrupted submit) would wait
    # on a command that never hears it. A handler here is reset to the default in each child.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Keep Ray and torch polite on a 2-core machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not hasattr(config, "workerinput"):  # the controller (or a run without -n)
        config.pluginmanager.register(SuiteTimes(), "ablate-suite-times")


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot (Linux ``/proc/stat``), else None."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class SuiteTimes:
    """Where the suite's time went (issue 44), printed after pytest's own summary: the sum of
    setup + call + teardown per test directory, and how busy the machine's CPUs were over the
    run (near 100% means the suite is CPU-bound: more workers would not make it faster)."""

    def __init__(self) -> None:
        self.by_dir: dict[str, float] = {}
        self.start = _cpu_jiffies()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0].split("/")
        key = "/".join(path[:2]) if len(path) > 2 else path[0]
        self.by_dir[key] = self.by_dir.get(key, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.by_dir:
            return
        total = sum(self.by_dir.values())
        terminalreporter.section("time per directory (setup + call + teardown, summed)")
        for key, secs in sorted(self.by_dir.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{secs:9.0f} s  {100 * secs / total:5.1f}%  {key}")
        terminalreporter.write_line(f"{total:9.0f} s  total")
        end = _cpu_jiffies()
        if self.start and end and end[1] > self.start[1]:
            busy = (end[0] - self.start[0]) / (end[1] - self.start[1])
            terminalreporter.write_line(
                f"CPUs busy {100 * busy:.0f}% of the run ({os.cpu_count()} cores, all processes)")


# How the suite splits over pytest-xdist's workers (``pytest -n 2``, the README's test command):
# each test file runs whole on one worker, so its module-scoped setup (a
# verl grid, an MLflow server) runs once; the files below share one worker and run one after
# another, because each of them takes the whole machine (a verl or vLLM job on every core) or a
# session-wide cluster (Slurm). Without ``-n`` nothing here changes what runs or its order.
SERIAL_GROUPS = {"tests/verl_cpu/": "engines", "tests/vllm_cpu/": "engines",
                 "tests/slurm/": "slurm"}
FIRST_GROUP = "engines"  # the longest: it starts first so no worker idles at the end


def scope_of(nodeid: str) -> str:
    """The unit of work one worker takes whole: a serial group, else the test's file."""
    path = nodeid.split("::", 1)[0]
    return next((g for prefix, g in SERIAL_GROUPS.items() if path.startswith(prefix)), path)


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's per-scope scheduler with ``scope_of``'s units (its ``xdist_group`` marks
        would do this, but xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9
        no longer reads, so the marks are silently ignored)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)  # `-p no:xdist` runs without it
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") not in ("load", "loadfile", "loadscope"):
            return None  # ``--dist each``, ``worksteal``...: the caller's choice
        config.option.loadscopereorder = False  # keep the order set below
        return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (only workers collect what runs), order the units of work: the
    engines group first, then the units holding a ``slow`` test, then the rest, each unit's
    tests in their own order."""
    if not hasattr(config, "workerinput"):
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(scope_of(item.nodeid), []).append(item)
    ordered = sorted(units.items(), key=lambda u: (
        u[0] != FIRST_GROUP, not any(i.get_closest_marker("slow") for i in u[1])))
    items[:] = [item for _, unit in ordered for item in unit]
