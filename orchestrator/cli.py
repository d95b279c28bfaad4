"""The ``ablate`` command line. Thin: parse, call one library function, print.

Exit codes: 0 ok, 1 internal error (with traceback), 2 user error (one line, no traceback),
3 the command's machinery is not available here.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.exceptions import UserError

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, str]] = {}  # name -> (module, function) for lazily built commands


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


# --------------------------------------------------------------------------- plan


def plan_command(args: argparse.Namespace) -> int:
    from orchestrator.grid import expand, load_grid

    grid = load_grid(args.grid, backend=args.backend)
    if args.show_recipe:
        from orchestrator.recipes import flatten

        for key, value in flatten(grid.recipe_config):
            print(f"{key} = {json.dumps(value)}")
        return 0
    trials = expand(grid, force=args.force)
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
    return 0


def _backend_details(grid: Any, trials: Sequence[Any]) -> dict[str, list[str]]:
    from orchestrator.backends import backend_class

    cls = backend_class(grid.backend)
    describe = getattr(cls, "describe", None)
    if describe is None:
        return {t.trial_id: [f"{k}={json.dumps(v, default=list)}" for k, v in t.overrides]
                for t in trials}
    return {t.trial_id: list(describe(t, grid.trial_config(t), grid.pools.pools[t.pool]))
            for t in trials}


def _print_plan(grid: Any, trials: Sequence[Any], details: dict[str, list[str]], limit: int) -> None:
    from rich.table import Table

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
        table.add_row(t.trial_id, t.pool, str(t.seed), *[axes.get(n, "") for n in names])
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
    if grid.spec.search is not None:
        s = grid.spec.search
        console.print(f"search: {s.budget} trials by optuna ({s.sampler}) over "
                      + ", ".join(s.params) + f"; objective {s.objective.mode} {s.objective.metric}")


# --------------------------------------------------------------------------- env


def env_command(args: argparse.Namespace) -> int:
    from orchestrator.environment import collect

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


def _lazy(name: str) -> Command:
    """A command implemented in another module; 'not available yet' if it is not built."""

    def run(args: argparse.Namespace) -> int:
        module, func = COMMANDS[name]
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            print(f"ablate {name}: not available yet in this version (needs {module})",
                  file=sys.stderr)
            return 3
        fn: Command = getattr(mod, func)
        return fn(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    from orchestrator import __version__

    p = argparse.ArgumentParser(
        prog="ablate",
        description="Declarative ablation grids for training-inference mismatch in LLM RL. "
        "Write a grid file, `ablate plan` it, `ablate submit` it, read `ablate compare`.",
    )
    p.add_argument("--version", action="version", version=f"rl-ablate {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = sub.add_parser("plan", help="validate and expand a grid; print its trials (no side effects)")
    plan.add_argument("grid", help="grid file, e.g. grids/quickstart.yaml")
    plan.add_argument("--json", action="store_true", help='print {"trials": [...]} as JSON')
    plan.add_argument("--backend", choices=["sim", "verl", "k8s"], help="override the grid's backend")
    plan.add_argument("--force", action="store_true", help="allow more than budget.max_trials trials")
    plan.add_argument("--limit", type=int, default=200, help="rows to print (0 = all)")
    plan.add_argument("--show-recipe", action="store_true",
                      help="print the composed recipe's keys (what a grid can override) and exit")
    plan.add_argument("--show-overrides", action="store_true",
                      help="show each trial's backend overrides (for verl: the exact Hydra list)")
    plan.set_defaults(func=plan_command)

    env = sub.add_parser("env", help="versions, devices, Ray and MLflow endpoints (for bug reports)")
    env.add_argument("--json", action="store_true")
    env.set_defaults(func=env_command)

    from orchestrator.commands import add_commands

    add_commands(sub, _lazy)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ablate plan ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
