"""The ``ablate`` command line. Thin: parse, call one library function, print.

Exit codes: 0 ok, 1 internal error (with traceback), 2 user error (one line, no traceback).
"""
from __future__ import annotations

import argparse
import errno
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import backends
from orchestrator.cli.commands import add_commands
from orchestrator.cli.environment import collect
from orchestrator.cli.guard import guarded_streams, missing_package, refused_path
from orchestrator.cli.scaffold import init_command
from orchestrator.exceptions import GateFailed, UserError

if TYPE_CHECKING:
    from orchestrator.grid import GridSpec
    from orchestrator.trial import TrialSpec


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


# --------------------------------------------------------------------------- plan


def plan_command(args: argparse.Namespace) -> int:
    # deferred, as every command's library: the grid schema is not imported for the others
    from orchestrator.grid import check_notify, expand, load_grid, preflight_gates
    from orchestrator.recipes import flatten

    grid = load_grid(args.grid, backend=args.backend,
                     limit_trials=not (args.force or args.show_recipe))
    if args.show_recipe:
        for key, value in flatten(grid.recipe_config):
            print(f"{key} = {json.dumps(value)}")
        return 0
    trials = expand(grid, force=args.force)
    check_notify(grid)
    gates = preflight_gates(grid)
    details = _backend_details(grid, trials) if args.show_overrides else {}
    if args.json:
        out = {
            "grid": grid.name,
            "backend": grid.backend,
            "recipe": grid.spec.recipe,
            "count": len(trials),
            "trials": [
                {"trial_id": t.trial_id, "pool": t.pool, "seed": t.seed,
                 "axes": dict(t.axes), "overrides": dict(t.overrides),
                 **({"backend_args": details[t.trial_id]} if details else {})}
                for t in trials
            ],
        }
        if grid.spec.search is not None:
            out["search"] = grid.spec.search.model_dump(mode="json")
        json.dump(out, sys.stdout, default=list)
        sys.stdout.write("\n")
        return 0
    _print_plan(grid, trials, details, args.limit)
    if gates and grid.spec.preflight.probe:
        act = ("refuses the grid" if grid.spec.preflight.on_fail == "refuse"
               else "skips a configuration")
        print(f"preflight: `ablate submit` probes each configuration first (ablate probe) and "
              f"{act} beyond {', '.join(map(str, gates))}")
    return 0


def _backend_details(grid: GridSpec, trials: Sequence[TrialSpec]) -> dict[str, list[str]]:
    runs = backends.backend(grid.backend)
    return {t.trial_id: list(runs.describe(t, grid.trial_config(t)))
            for t in trials}


def _print_plan(grid: GridSpec, trials: Sequence[TrialSpec], details: dict[str, list[str]],
                limit: int) -> None:
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.grid import plan_lines  # deferred, as in plan_command

    console = _console()
    names = [a.name for a in grid.axes if a.kind != "pool"]
    table = Table(title=f"{grid.name}: {len(trials)} trials ({grid.backend}, recipe {grid.spec.recipe})")
    table.add_column("trial_id", no_wrap=True)
    table.add_column("pool")
    table.add_column("seed", justify="right")
    for n in names:
        table.add_column(n)
    shown = trials if limit <= 0 else trials[:limit]
    for t in shown:
        axes = t.axis_values
        # Labels are text, not rich markup ("[null, 2.0]" is no tag).
        table.add_row(t.trial_id, t.pool, str(t.seed), *[escape(axes.get(n, "")) for n in names])
    console.print(table)
    for t in shown if details else ():
        # Plain lines, never wrapped or cut, so a list can be copied into a command line.
        print(f"\n{t.trial_id} ({t.pool}, seed {t.seed}) {grid.backend} overrides:")
        for line in details[t.trial_id]:
            print(f"  {line}")
    if len(shown) < len(trials):
        console.print(f"... {len(trials) - len(shown)} more (use --limit 0 to show all)")
    pools: dict[str, int] = {}
    for t in trials:
        pools[t.pool] = pools.get(t.pool, 0) + 1
    console.print(f"{len(trials)} trials, {grid.spec.steps} steps each; by pool: "
                  + ", ".join(f"{p}={n}" for p, n in sorted(pools.items())))
    for line in plan_lines(grid, trials):
        console.print(line, markup=False)
    if grid.spec.search is not None:
        s = grid.spec.search
        console.print(f"search: {s.budget} trials by optuna ({s.sampler}) over "
                      + ", ".join(s.params) + f"; objective {s.objective.mode} {s.objective.metric}")


# --------------------------------------------------------------------------- env


def env_command(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        json.dump(info, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return 0
    from rich.table import Table

    table = Table(title="ablate env", show_header=False)
    for k, v in info.items():
        table.add_row(k, str(v))
    _console().print(table)
    return 0


# --------------------------------------------------------------------------- parser


class _Version(argparse.Action):
    """``--version``, read from the package metadata only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from orchestrator import __version__  # deferred: read only when asked

        print(f"rl-ablate {__version__}")  # to stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ablate",
        description="Declarative ablation grids for training-inference mismatch in LLM RL. "
        "Write a grid file, `ablate plan` it, `ablate submit` it, read `ablate compare`.",
    )
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = sub.add_parser("plan", help="validate and expand a grid; print its trials (no side effects)")
    plan.add_argument("grid", help="grid file, e.g. grids/quickstart.yaml")
    plan.add_argument("--json", action="store_true", help='print {"trials": [...]} as JSON')
    plan.add_argument("--backend", choices=backends.names(), help="override the grid's backend")
    plan.add_argument("--force", action="store_true", help="allow more than budget.max_trials trials")
    plan.add_argument("--limit", type=_count, default=200, help="rows to print (0 = all)")
    plan.add_argument("--show-recipe", action="store_true",
                      help="print the composed recipe's keys (what a grid can override) and exit")
    plan.add_argument("--show-overrides", action="store_true",
                      help="show each trial's backend overrides (for verl: the exact Hydra list)")
    plan.set_defaults(func=plan_command)

    env = sub.add_parser("env", help="versions, devices, Ray and MLflow endpoints (for bug reports)")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=env_command)

    init = sub.add_parser("init", help="write a starter grid (and a pool catalogue) to edit")
    init.add_argument("dir", nargs="?", default=".", help="folder to write into (default: .)")
    init.add_argument("--pools", action="store_true",
                      help="also write pools.yaml, a pool catalogue of your own the grid uses")
    init.add_argument("--force", action="store_true", help="overwrite files that exist")
    init.set_defaults(func=init_command)

    add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with guarded_streams():  # a reader that leaves (`| head`) stops the output, not the command
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        _refuse_empty(args)
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except GateFailed as exc:  # a measured result, not bad input: its lines, exit 1
        print("\n".join(exc.lines), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:  # importlib.metadata's PackageNotFoundError is one
        line = missing_package(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    except OSError as exc:
        line = refused_path(exc)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            return 2
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        # The environment, not the program: a disk that filled up or turned read-only mid-way.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror}; fix: free space (or pass --workdir on a writable "
              "disk with room) and run the command again: finished work is kept", file=sys.stderr)
        return 2


def _refuse_empty(args: argparse.Namespace) -> None:
    """An option given as '' would silently mean its default (``--tracking-uri ''`` the local
    store, ``--workdir ''`` ./.ablate, ``--address ''`` a local Ray): refused instead."""
    for dest, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        if dest not in ("grid", "func", "command") and any(
                isinstance(v, str) and not v.strip() for v in values):
            flag = "--" + dest.rstrip("_").replace("_", "-")
            raise UserError(f"{flag} '': an empty value (it is not the default); fix: give "
                            f"{flag} a value, or leave the flag out")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0 (0 = all)")
    return value


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
