"""The CLI reference, generated from the argument parser (``orchestrator.cli.parser.build_parser``)."""
from __future__ import annotations

import argparse

from modeldoc import cell


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    for action in parser._actions:  # argparse keeps its subparsers here, and only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _option(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    return f"`{names} {action.metavar or action.dest.upper().rstrip('_')}`"


def _details(action: argparse.Action) -> str:
    bits = []
    if action.choices:
        bits.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if action.required and action.option_strings:
        bits.append("required")
    if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
        bits.append("repeatable")
    if action.nargs == "?" and not action.option_strings:
        bits.append("optional")
    default = action.default
    if action.option_strings and action.nargs != 0 and default not in (None, argparse.SUPPRESS):
        bits.append(f"default `{default}`")
    return "; ".join(bits)


def render(parser: argparse.ArgumentParser) -> str:
    """A section per command: what it does, its usage line and a table of its arguments."""
    parts = [parser.description or "", "", "```text", parser.format_usage().strip(), "```", ""]
    for name, (sub, help_text) in _subcommands(parser).items():
        parts += [f"## `ablate {name}`", "", help_text[:1].upper() + help_text[1:] + ".", "",
                  "```text", sub.format_usage().strip(), "```", ""]
        rows = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        if rows:
            parts += ["| argument | meaning | values |", "|---|---|---|"]
            parts += [f"| {_option(a)} | {cell(a.help or '')} | {cell(_details(a))} |"
                      for a in rows]
            parts.append("")
    return "\n".join(parts)
