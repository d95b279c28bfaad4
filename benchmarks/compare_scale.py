"""How ``ablate status`` and ``ablate compare`` scale with the number of trials (issue 27).

For each T in ``--trials`` it records a grid of T trials x ``--steps`` steps x ``--metrics``
metrics per step through the project's own recording code: every trial runs as one attempt of
``run.run_attempt`` (the runner: trial lock, files, verdict engine, the MLflow child run of the
SQLite store under the workdir), with a backend that logs generated values (a sine-shaped reward,
a k3 KL with one-step spikes, a grad norm with rare explosions, 10% of trials collapsing). Then,
each in a fresh subprocess, it times:

* ``status_s``: ``ablate status GRID`` on the workdir (and ``status_cpu_s``, its CPU seconds:
  on a shared machine the figure another job inflates least);
* ``status_cold_s`` (``--cold-status``): the same, right after emptying the kernel's page cache
  (where this process may write ``/proc/sys/vm/drop_caches``: root), every file read from disk;
* ``compare_local_s``: ``ablate compare GRID`` with the workdir and its SQLite store;
* ``compare_server_s``: ``ablate compare GRID`` against a loopback ``mlflow server`` on the same
  SQLite file, with an empty workdir (compare on another machine).
* ``compare_local_unchanged_s``: the local compare run twice more, the second timed: a look at
  a grid where nothing changed since the last look (compare keeps the run list while the store
  is unchanged, ``orchestrator/compare/_runs.py``; the first of the two finds the store changed
  by the publishing of the compare before it).

Each checkout's commands run twice: with ``--baseline`` in the order baseline, code, code,
baseline, without it code twice (its first run is then the coldest); each figure is the mean of
the two, both runs kept under ``runs`` with their position, so no figure owes anything to what
ran before it. Both checkouts are byte-compiled first (as ``pip install`` leaves a package), so
no start-up pays a compile the other does not. The MLflow server is started as ``ablate ui``
starts it and timing begins once its processes are idle.

``--code PATH`` records and times another checkout (e.g. ``/work/main`` for the figures before a
change); ``--baseline PATH`` times the same commands with another checkout's code (e.g. ``/work/main``)
on the same recorded grid, in the same run (``baseline`` in each row); that code ignores the
files it does not know. ``--keep DIR`` keeps the recorded grids and reuses them on a later run
(recording 1,000 trials takes about half an hour on 2 cores: MLflow's SQLite store takes about
7,000 metric values a second). ``--lock FILE`` holds an exclusive ``flock`` on FILE while timing
(not while recording), for a machine shared with other benchmarks. An existing ``--json`` FILE keeps
its earlier runs under ``history`` (newest first).

    python benchmarks/compare_scale.py --trials 100 1000 --steps 300 --json FILE
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The checkout that records the grids (``--code``; this one unless a parent run says otherwise).
CODE = Path(os.environ.get("COMPARE_SCALE_CODE", REPO))
sys.path.insert(0, str(CODE))

from orchestrator import metrics as M
from orchestrator.backends.base import Trainer

GRID_NAME = "compare-scale"
SEEDS = 5  # trials = lr values x 2 IS levels x 2 pools x 5 seeds


def grid_yaml(trials: int, steps: int, every: int = 1) -> str:
    """A sim grid of exactly ``trials`` trials (a multiple of 20); ``every``: its
    ``tracking.every`` (1: the line is left out, the schema's default)."""
    n = trials // (4 * SEEDS)
    lrs = ", ".join(f"{1e-4 * (1 + i):.6g}" for i in range(n))
    return (f"name: {GRID_NAME}\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: {steps}\n"
            f"seeds: {list(range(SEEDS))}\n"
            f"axes:\n  train.lr: [{lrs}]\n  correction.is_level: [token, sequence]\n"
            f"  pool: [sim-h100, sim-a100]\n"
            f"early_stop: false\nbudget: {{max_trials: {max(trials, 1)}}}\n"
            f"checkpoint: {{every: {steps}}}\n"
            + (f"tracking: {{every: {every}}}\n" if every != 1 else ""))


def metric_names(n: int) -> list[str]:
    """``n`` metric names: the curve metrics, the probability buckets, then the rest of the
    shared vocabulary (the sizes of a real trial: 38-40 metrics a step)."""
    head = [M.EVAL_REWARD, M.TRAIN_REWARD, M.K3_KL, M.GRAD_NORM]
    head += [M.bucket_name(lo, hi) for lo, hi in M.PROB_BUCKETS]
    rest = sorted(v for k, v in vars(M).items() if k.isupper() and isinstance(v, str)
                  and "/" in v and v not in head)
    names = head + rest
    names += [f"bench/extra_{i}" for i in range(max(0, n - len(names)))]
    return names[:n]


class GeneratedTrainer(Trainer):
    """Logs generated values through the runner's ``RunContext`` (nothing is trained)."""

    name = "sim"
    version = "compare-scale-1"
    pool_kinds = ("sim",)
    metrics = 40

    def run(self, trial: Any, config: Mapping[str, Any], ctx: Any) -> Any:
        from orchestrator.backends.base import AttemptOutcome, AttemptResult

        seed = int(hashlib.sha256(trial.trial_id.encode()).hexdigest()[:8], 16)
        collapse_at = 100 + seed % 150 if seed % 10 == 0 else None
        names = metric_names(self.metrics)
        start = (ctx.resume_step or 0) + 1
        for step in range(start, trial.steps + 1):
            x = step / trial.steps
            down = collapse_at is not None and step >= collapse_at
            reward = 0.1 if down else 0.3 + 0.5 * x + 0.05 * math.sin(step * 0.7 + seed % 7)
            kl = (1e-3 * (1 + x) * (50.0 if step % 97 == seed % 97 else 1.0)) * (30.0 if down else 1.0)
            row = {}
            for i, name in enumerate(names):
                if name == M.EVAL_REWARD:
                    if step % 10 == 0:
                        row[name] = reward + 0.01
                    continue
                row[name] = (reward if name == M.TRAIN_REWARD else kl if name == M.K3_KL
                             else (400.0 if step % 131 == seed % 131 else 1.0 + x) if name == M.GRAD_NORM
                             else math.cos(step * 0.01 * (i + 1)) * (i + 1))
            ctx.log_metrics(step, row)
        return AttemptResult(AttemptOutcome.COMPLETED, trial.steps, None)


def record_grid(root: Path, trials: int, steps: int, metrics: int, tracked: bool = True,
                every: int = 1) -> float:
    """Write the grid's files and (if ``tracked``) MLflow runs under ``root``; returns the
    seconds it took."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.run import make_job, run_attempt
    from orchestrator.store import workspace
    from orchestrator.tracking import parent_run

    GeneratedTrainer.metrics = metrics
    (root / "grid.yaml").write_text(grid_yaml(trials, steps, every))
    grid = load_grid(root / "grid.yaml")
    specs = expand(grid, force=True)
    assert len(specs) == trials, (len(specs), trials)
    wd = root / "workdir"
    wd.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    uri = workspace.tracking_uri(None, wd)
    with parent_run(grid, tracking_uri=uri, workdir=wd) if tracked else contextlib.nullcontext() as target:
        for i, trial in enumerate(specs):
            job = make_job(grid, trial, grid_dir=workspace.grid_dir(grid.name, wd), tracking=target,
                           submission="compare-scale")
            job = dataclasses.replace(job, backend_ref=dataclasses.replace(
                job.backend_ref, trainer_refs=(("sim", (__name__, "GeneratedTrainer")),)))
            run_attempt(job)
            if (i + 1) % 100 == 0:
                print(f"  recorded {i + 1}/{trials} trials ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
    (root / "recorded.json").write_text(json.dumps({"trials": trials, "steps": steps, "metrics": metrics,
                                                    "tracked": tracked, "every": every}))
    return time.perf_counter() - t0


def _ablate(code: Path, args: list[str], cwd: Path, timeout: float) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``ablate`` command; the CPU seconds (user + system of
    its processes, reaped) are a figure another job on the machine inflates far less."""
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONHASHSEED": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return math.inf, math.inf  # recorded as null with ``timed_out_after_s``
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"ablate {' '.join(args)} (code {code}) exited {out.returncode}: "
                           f"{out.stderr[-2000:]}")
    return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _compile(checkout: Path) -> None:
    """Byte-compile a checkout's package before anything is timed, as ``pip install`` does: a
    command started with ``PYTHONDONTWRITEBYTECODE`` set (as on the development machines) would
    otherwise compile every module without a current ``.pyc`` on each start (0.15 s of a 1.4-s
    ``ablate status`` here), and a fresh baseline checkout has none at all."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "orchestrator")],
                   check=True, stdout=subprocess.DEVNULL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(db: Path, log: Path) -> Iterator[str]:
    """A loopback ``mlflow server`` on the SQLite file ``db`` as ``ablate ui`` starts it (its
    command and environment: MLflow's job runner off), stopped on exit. Yields once it answers
    and its processes are idle: MLflow's job runner, when on, starts ~7 more processes after
    ``/health`` answers, ~20 CPU-seconds that the first command timed would compete with.
    Stopped as ``ablate ui`` stops it: its whole process group (gunicorn's workers too)."""
    from orchestrator.tracking import server_command, server_env, stop_group

    port = _free_port()
    with open(log, "w") as fh:
        proc = subprocess.Popen(server_command(f"sqlite:///{db}", port, db.parent / "artifacts"),
                                env=server_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start; see {log}")
            time.sleep(0.5)
        _settle(proc.pid)
        yield url
    finally:
        stop_group(proc)


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _drop_page_cache() -> bool:
    """Empty the kernel's page cache (root only), so the next command reads every file it
    opens from the disk; False where this process may not."""
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
    except OSError:
        return False
    return True


COLD = {"status": False}  # --cold-status


def _status(code: Path, root: Path, timeout: float) -> dict[str, float]:
    """``status_s`` and ``status_cpu_s`` of one ``ablate status`` of the recorded grid, and
    before it, with ``--cold-status`` where the page cache can be emptied, ``status_cold_s``: the
    same command with every file read from the disk (each turn starts with it, so every
    checkout's turn starts from the same cold cache)."""
    argv = ["status", str(root / "grid.yaml"), "--workdir", str(root / "workdir")]
    out = {}
    if COLD["status"] and _drop_page_cache():
        out["status_cold_s"] = round(_ablate(code, argv, root, timeout)[0], 2)
    wall, cpu = _ablate(code, argv, root, timeout)
    return {**out, "status_s": round(wall, 2), "status_cpu_s": round(cpu, 2)}


def _tree_cpu_s(pid: int) -> float:
    import psutil

    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


def _settle(pid: int, idle_s: float = 0.1, limit_s: float = 60.0) -> None:
    """Wait (at most ``limit_s``) until process ``pid`` and its children use under ``idle_s``
    CPU-seconds in a second: a server still starting workers would slow what is timed next."""
    deadline = time.monotonic() + limit_s
    before = _tree_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _tree_cpu_s(pid)
        if now - before < idle_s:
            return
        before = now


def _in_turns(code: Path, baseline: Path | None, run: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``run(checkout, tag)`` (a dict of timings) twice for each checkout: with a baseline in
    the order baseline, code, code, baseline, so neither is measured only after the other had
    warmed the page cache for it; without, code twice (its first run the coldest of all).
    Each checkout's figures are the mean of its two runs, with both runs kept (``runs``)."""
    order = [(baseline, "-baseline"), (code, ""), (code, ""), (baseline, "-baseline")] \
        if baseline is not None else [(code, ""), (code, "")]
    runs: dict[str, list[dict[str, Any]]] = {"": [], "-baseline": []}
    for position, (checkout, tag) in enumerate(order, 1):
        runs[tag].append({"position": position, **run(checkout, tag)})
    return _mean(runs[""]), (_mean(runs["-baseline"]) if baseline is not None else None)


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for key in runs[0]:
        if key.endswith("_s"):
            vals = [r.get(key) for r in runs]
            out[key] = (round(sum(vals) / len(vals), 2)  # type: ignore[arg-type]
                        if all(v is not None for v in vals) else None)
    timed_out = [r["timed_out_after_s"] for r in runs if "timed_out_after_s" in r]
    if timed_out:
        out["timed_out_after_s"] = timed_out[0]
    return out


def time_commands(code: Path, root: Path, server: str, timeout: float, tag: str = "") -> dict[str, float]:
    """status, compare (local), compare (server, no workdir) with the code at ``code``; the
    compare outputs go to ``out-local{tag}`` and ``out-server{tag}``."""
    wd, grid = root / "workdir", str(root / "grid.yaml")
    empty = root / "empty-workdir"
    shutil.rmtree(empty, ignore_errors=True)
    empty.mkdir()
    for o in (f"out-local{tag}", f"out-server{tag}"):  # a kept grid's earlier outputs
        shutil.rmtree(root / o, ignore_errors=True)
    out = _status(code, root, timeout)
    local = ["compare", grid, "--workdir", str(wd), "--out", str(root / f"out-local{tag}")]
    out["compare_local_s"] = _ablate(code, local, root, timeout)[0]
    # A look at a grid where nothing changed since the last look: the same compare twice more,
    # the second timed (the first finds the store changed by the publishing just before it).
    _ablate(code, local, root, timeout)
    out["compare_local_unchanged_s"] = _ablate(code, local, root, timeout)[0]
    out["compare_server_s"] = _ablate(code, ["compare", grid, "--workdir", str(empty), "--tracking-uri",
                                             server, "--out", str(root / f"out-server{tag}")], root, timeout)[0]
    timed = {k: (round(v, 2) if math.isfinite(v) else None) for k, v in out.items()}
    if not all(math.isfinite(v) for v in out.values()):
        timed["timed_out_after_s"] = timeout
    return timed


TABLE_COLUMNS = ("trial_id", "verdict", "last_step", "final_reward", "peak_reward", "max_k3_kl",
                 "max_grad_norm")


def _code_label(code: Path) -> str:
    """The checkout's commit (never its path: results name no directory of this machine)."""
    out = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    return f"commit {out.stdout.strip()}" if out.returncode == 0 else "unknown checkout"


def _tables_agree(root: Path, baseline: bool) -> bool:
    """The per-trial tables (trials.csv) of every compare run here that finished hold the same
    numbers."""
    import numpy as np
    import pandas as pd

    outs = [o for o in ["out-local", "out-server"] + (["out-local-baseline", "out-server-baseline"]
                                                     if baseline else []) if (root / o / "trials.csv").exists()]
    frames = [pd.read_csv(root / o / "trials.csv")[list(TABLE_COLUMNS)].sort_values("trial_id")
              .reset_index(drop=True) for o in outs]
    ref = frames[0]
    nums = [c for c in TABLE_COLUMNS if c not in ("trial_id", "verdict")]
    return all(f["trial_id"].equals(ref["trial_id"]) and f["verdict"].equals(ref["verdict"])
               and bool(np.allclose(f[nums].to_numpy(float), ref[nums].to_numpy(float),
                                    rtol=1e-12, atol=0, equal_nan=True)) for f in frames[1:])


def _size_mb(path: Path) -> float:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else (
        path.stat().st_size if path.exists() else 0)
    return round(total / 2**20, 1)


def _loadavg() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/loadavg").read_text().strip()
    return ""


def _record_in(code: Path, root: Path, trials: int, steps: int, metrics: int, tracked: bool,
               every: int = 1) -> float:
    """``record_grid`` with the code at ``code``, in a subprocess (its imports are that code's)."""
    env = {**os.environ, "COMPARE_SCALE_CODE": str(code), "PYTHONPATH": str(code)}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run([sys.executable, __file__, "--record", str(root), str(trials), str(steps),
                          str(metrics), f"tracked:{every}" if tracked else "status"], env=env, check=True, stdout=subprocess.PIPE, text=True)
    return float(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    import fcntl

    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def measure(trials: int, steps: int, metrics: int, keep: Path | None, code: Path,
            baseline: Path | None, timeout: float, lock: Path | None,
            status_only: bool = False, every: int = 1, baseline_timeout: float | None = None) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if keep is not None:
            root = keep / (f"t{trials}-s{steps}-m{metrics}" + ("-status" if status_only else "")
                           + (f"-e{every}" if every != 1 else ""))
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compare-scale-")))
        build_s = None
        marker = root / "recorded.json"
        done = {"tracked": True, "every": 1, **json.loads(marker.read_text())} if marker.exists() else None
        if done != {"trials": trials, "steps": steps, "metrics": metrics, "tracked": not status_only,
                    "every": every}:
            shutil.rmtree(root / "workdir", ignore_errors=True)
            print(f"recording {trials} trials x {steps} steps x {metrics} metrics in {root}",
                  file=sys.stderr, flush=True)
            build_s = round(_record_in(code, root, trials, steps, metrics, not status_only, every), 1)
        # compare's cache of plots and importance (issue 58), emptied here: the checkout's first
        # compare of the grid draws (cold), its second reuses (warm); ``runs`` keeps both.
        os.environ["ABLATE_CACHE_DIR"] = str(root / "compare-cache")
        shutil.rmtree(root / "compare-cache", ignore_errors=True)
        row: dict[str, Any] = {"trials": trials, "steps": steps, "metrics": metrics, "tracking_every": every,
                               "record_s": build_s, "store_mb": _size_mb(root / "workdir" / "mlflow.db"),
                               "workdir_mb": _size_mb(root / "workdir" / GRID_NAME), "code": _code_label(code)}
        if status_only:
            with _locked(lock):
                row["loadavg_before"] = _loadavg()
                ours, theirs = _in_turns(code, baseline, lambda c, tag: _status(
                    c, root, timeout if tag == "" else (baseline_timeout or timeout)))
                row.update(ours)
                if theirs is not None:
                    row["baseline"] = {"code": _code_label(baseline), **theirs}
                row["loadavg_after"] = _loadavg()
            print(json.dumps(row), file=sys.stderr, flush=True)
            return row
        with _locked(lock), mlflow_server(root / "workdir" / "mlflow.db", root / "server.log") as url:
            row["loadavg_before"] = _loadavg()
            ours, theirs = _in_turns(code, baseline, lambda c, tag: time_commands(
                c, root, url, timeout if tag == "" else (baseline_timeout or timeout), tag))
            row.update(ours)
            if theirs is not None:
                row["baseline"] = {"code": _code_label(baseline), **theirs}
            row["loadavg_after"] = _loadavg()
        row["tables_agree"] = _tables_agree(root, baseline is not None)
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--metrics", type=int, default=40)
    p.add_argument("--code", type=Path, default=REPO, help="the checkout that records and is timed")
    p.add_argument("--baseline", type=Path, help="another checkout to time on the same grids")
    p.add_argument("--lock", type=Path, help="flock this file while timing")
    p.add_argument("--status-only", action="store_true",
                   help="record without MLflow and time `ablate status` alone (large T)")
    p.add_argument("--record", nargs=5, metavar=("ROOT", "TRIALS", "STEPS", "METRICS", "MODE"),
                   help=argparse.SUPPRESS)  # internal: record one grid with this process's code
    p.add_argument("--keep", type=Path, help="keep (and reuse) the recorded grids under this directory")
    p.add_argument("--timeout", type=float, default=1800.0, help="per command, seconds")
    p.add_argument("--baseline-timeout", type=float,
                   help="per command of the baseline (a command past it is recorded as timed out)")
    p.add_argument("--tracking-every", type=int, default=1, help="the recorded grid's tracking.every")
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--cold-status", action="store_true",
                   help="also time status after emptying the page cache (root; slows what runs beside)")
    args = p.parse_args()
    COLD["status"] = args.cold_status
    if args.record:
        root, t, st, m, mode = args.record
        os.nice(10)  # recording is not timed: it yields the 2 shared cores to what is
        kind, _, every = mode.partition(":")
        print(record_grid(Path(root), int(t), int(st), int(m), kind == "tracked", int(every or 1)))
        return
    bad = [t for t in args.trials if t <= 0 or t % (4 * SEEDS)]
    if bad:
        p.error(f"--trials {bad}: each must be a positive multiple of {4 * SEEDS}")
    for checkout in (args.code.resolve(), args.baseline):
        if checkout is not None:
            _compile(checkout)
    rows = [measure(t, args.steps, args.metrics, args.keep, args.code.resolve(), args.baseline,
                    args.timeout, args.lock, args.status_only, args.tracking_every, args.baseline_timeout)
            for t in args.trials]
    out: dict[str, Any] = {"benchmark": "compare_scale", "rows": rows}
    if args.json and args.json.is_file():  # earlier runs stay, newest first, under "history"
        with contextlib.suppress(ValueError, AttributeError):
            old = json.loads(args.json.read_text())
            earlier = [{"rows": old["rows"]}] if old.get("rows") else []
            out["history"] = earlier + list(old.get("history", []))
    emit(out, args.json)


def emit(out: dict[str, Any], path: Path | None) -> None:
    """Print ``out`` as JSON and, with ``path``, write it there too."""
    text = json.dumps(out, indent=2)
    print(text)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


if __name__ == "__main__":
    main()
