"""The vocabularies (``correction.*``, ``rollout.*``, ...): each value, and what each backend does
with it, found by asking the code.

The vocabularies are the models the grid language registers (``orchestrator.grid.SECTIONS``),
so a new one appears here by itself. For every value of every key, each probe below plans a
one-trial grid that sets it, through the same pipeline as ``ablate plan`` (``load_grid``,
``expand``, the backend's ``describe``): a refusal is the backend's own plan-time message; an
accepted value shows the lines it changes in the backend's override list (for verl: the exact
Hydra overrides of the job) or, on the simulator, in the rollout engine's resolved numerics.
"""
from __future__ import annotations

import inspect
import re
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from modeldoc import cell, default_text, field_text, model_text, rst, type_text
from pydantic import BaseModel, ValidationError

# (column, backend, pool, recipe): one probe per way a value can be run.
PROBES = (
    ("simulator (`sim-h100`)", "sim", "sim-h100", "sim/grpo_tiny"),
    ("verl, gpu pool (`h100`)", "verl", "h100", "verl/qwen3_4b_dapo"),
    ("k8s (`h100`)", "k8s", "h100", "verl/qwen3_4b_dapo"),
    ("verl, cpu pool (`cpu-fp32`)", "verl", "cpu-fp32", "verl/cpu_tiny"),
    ("Miles (`h100`)", "miles", "h100", "miles/qwen3_4b_dapo"),
)


def setups(sections: dict[str, type[BaseModel]]) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    """The probes, and on gpu pools one per rollout engine when the vocabulary names engines
    (``rollout.engine``): the same flag maps to different keys per engine."""
    engines: list[Any] = []
    rollout = sections.get("rollout")
    if rollout is not None and "engine" in rollout.model_fields:
        from orchestrator.engine import ENGINES  # gpu pools' engines (cpu pools: cpu, vllm)

        engines = [v for v in candidate_values(rollout, "engine") if v in ENGINES]
    out = []
    for title, backend, pool, recipe in PROBES:
        if engines and backend in ("verl", "k8s") and not pool.startswith("cpu"):
            out += [(title.replace(" (", f", {engine} ("), backend, pool, recipe,
                     {"rollout.engine": engine}) for engine in engines]
        else:
            out.append((title, backend, pool, recipe, {}))
    return out


_REFUSAL = re.compile(r"cannot run \(fixed settings\): (.*?)(?:; fix: exclude this combination "
                      r"or change the value)?$")


@dataclass(frozen=True)
class Outcome:
    refused: str | None = None
    same: bool = False  # the same trial as the probe's default one
    changes: tuple[str, ...] = ()
    unchanged: str = "accepted"  # what to say when it is accepted and nothing listed changes

    def text(self) -> str:
        if self.refused is not None:
            return f"refused: {self.refused}"
        if self.same:
            return "no effect here (the same trial as the default)"
        if not self.changes:
            return self.unchanged
        return "<br>".join(f"`{c}`" for c in self.changes)


class Probe:
    """Plans one-trial grids on one backend, pool and recipe."""

    def __init__(self, backend: str, pool: str, recipe: str, workdir: Path,
                 fixed: dict[str, Any] | None = None) -> None:
        self.backend, self.pool, self.recipe = backend, pool, recipe
        self.fixed = dict(fixed or {})
        self.file = workdir / f"probe-{backend}-{pool}-{len(list(workdir.iterdir()))}.yaml"
        self.base = self._plan({})
        assert self.base[0] is None, f"probe {backend}/{pool} refuses its own default: {self.base[0]}"

    def _plan(self, overrides: dict[str, Any]) -> tuple[str | None, str, list[str], Any]:
        from orchestrator.backends import backend
        from orchestrator.exceptions import UserError
        from orchestrator.grid import expand, load_grid

        self.file.write_text(yaml.safe_dump({
            "name": "vocabulary", "recipe": self.recipe, "backend": self.backend, "steps": 1,
            "pool": self.pool, "overrides": {**self.fixed, **overrides}}))
        try:
            grid = load_grid(self.file)
            trial = expand(grid)[0]
            config = grid.trial_config(trial)
            lines = list(backend(self.backend).describe(trial, config))
        except UserError as exc:
            text = str(exc)
            m = _REFUSAL.search(text)
            return (m.group(1) if m else text.split(": ", 1)[-1]), "", [], None
        return None, trial.trial_id, lines, config

    def outcome(self, context: dict[str, Any], overrides: dict[str, Any],
                section: str) -> Outcome:
        """What the backend does with ``overrides`` on top of ``context`` (compared with the
        trial of ``context`` alone, or of the recipe's defaults if that is refused)."""
        base = self._plan(context)
        if base[0] is not None:
            base = self.base
        refused, trial_id, lines, extra = self._plan({**context, **overrides})
        if refused is not None:
            return Outcome(refused=refused)
        if trial_id == base[1]:
            return Outcome(same=True)
        if self.backend == "sim":
            if section != "rollout":
                return Outcome(unchanged="accepted: computed by the simulator")
            return Outcome(changes=tuple(_sim_changes(base[3], extra, section)),
                           unchanged="accepted; this pool's engine already computes so")
        # Lines that carry the trial id (run name, checkpoint directory) change with any value.
        seen = {line.replace(base[1], "") for line in base[2]}
        return Outcome(changes=tuple(line for line in lines
                                     if line.replace(trial_id, "") not in seen),
                       unchanged="accepted; the override list is unchanged (the recipe or pool already sets it)")


def _sim_changes(base: Any, probe: Any, section: str) -> list[str]:
    """What the simulator's rollout engine computes differently (its resolved numerics)."""
    if section != "rollout":
        return []
    from orchestrator.sim.profile import parse_profile, resolve_numerics

    def numerics(config: Any) -> dict[str, Any]:
        pool = config.pool  # a TrialConfig: its rollout section is typed already
        return resolve_numerics(parse_profile(pool.sim_profile, pool.name),
                                config.rollout).model_dump()

    before, after = numerics(base), numerics(probe)
    return [f"engine {k}: {before[k]} → {v}" for k, v in after.items() if before[k] != v]


# --------------------------------------------------------------------------- values

def _yaml(value: Any) -> str:
    """A value as a grid writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


_CANDIDATES: dict[type, list[Any]] = {int: [1, 4], float: [0.5, 2.0, 0.01]}


def candidate_values(model: type[BaseModel], name: str,
                     extra_examples: list[Any] = ()) -> list[Any]:
    """The values a key is shown with: every choice of a closed type, else an example."""
    info = model.model_fields[name]
    literal: list[Any] = []
    open_types: list[Any] = []

    def walk(annotation: Any) -> None:
        while typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        origin = typing.get_origin(annotation)
        if origin is typing.Literal:
            literal.extend(typing.get_args(annotation))
        elif origin in (typing.Union, types.UnionType):
            for a in typing.get_args(annotation):
                walk(a)
        elif annotation is bool:
            literal.extend([True, False])
        elif annotation is not type(None):
            open_types.append(annotation)

    walk(info.annotation)
    values = list(dict.fromkeys(literal))
    if values:
        return values
    examples = list(info.examples or []) + list(extra_examples)
    for annotation in open_types:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is tuple and len(args) == 2:
            examples += [[0.8, 1.25], [None, 3.0]]
        elif inspect.isclass(annotation):
            for base, vals in _CANDIDATES.items():
                if issubclass(annotation, base):
                    examples += vals
    default = info.get_default(call_default_factory=True)
    for value in examples:
        try:
            model.model_validate({name: value})
        except ValidationError:
            continue
        if value != default and list(value if isinstance(value, (list, tuple)) else [value]) != \
                list(default if isinstance(default, (list, tuple)) else [default]):
            return [value]
    return []


def _context(model: type[BaseModel], name: str, values: list[Any]) -> dict[str, Any]:
    """The other keys a value needs to matter: none if possible, else the first single setting
    under which every value is valid and the values give different configurations."""
    default = model.model_fields[name].get_default(call_default_factory=True)

    def score(ctx: dict[str, Any]) -> tuple[int, int]:
        specs = []
        for v in [*values, default]:
            try:
                spec = model.model_validate({**ctx, name: v})
            except ValidationError:
                continue
            canonical = getattr(spec, "canonical", None)
            specs.append((canonical() if canonical else spec).model_dump_json())
        return len(specs), len(set(specs))

    contexts: list[dict[str, Any]] = [{}]
    for other in model.model_fields:
        if other != name:
            other_default = model.model_fields[other].get_default(call_default_factory=True)
            contexts += [{other: v} for v in candidate_values(model, other) if v != other_default]
    best = max(contexts, key=lambda c: (score(c), -contexts.index(c)))
    return best


# --------------------------------------------------------------------------- page

def render(sections: dict[str, type[BaseModel]], meanings: dict[str, str],
           examples: dict[str, list[Any]]) -> str:
    """One section per vocabulary, one table per key: each value and each probe's outcome."""
    parts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        probes = [(title, Probe(b, p, r, Path(tmp), fixed))
                  for title, b, p, r, fixed in setups(sections)]
        for section, model in sections.items():
            parts.append(f"## `{section}.*` {{#{section}}}\n")
            module_doc = inspect.getdoc(inspect.getmodule(model)) or ""
            intro = rst(module_doc.split("\n\n")[0])
            parts.append(f"{intro}\n\nDefined in `{model.__module__.replace('.', '/')}.py` "
                         f"(`{model.__name__}`). {model_text(model)}\n")
            for name, info in model.model_fields.items():
                key = f"{section}.{name}"
                parts.append(f"### `{key}`\n")
                meaning = field_text(model, name) or meanings.get(key, "")
                typ = type_text(info.annotation, lambda m: m.__name__)
                parts.append(f"{meaning}\n\nType: {typ}; default: {default_text(info)}.\n"
                             if meaning else f"Type: {typ}; default: {default_text(info)}.\n")
                values = candidate_values(model, name, examples.get(key, []))
                if not values:
                    parts.append("(No example value to probe: see the type above.)\n")
                    continue
                ctx = _context(model, name, values)
                context = {f"{section}.{k}": v for k, v in ctx.items()}
                columns = [(title, [probe.outcome(context, {key: value}, section).text()
                                    for value in values]) for title, probe in probes]
                columns = _merge(columns)
                if ctx:
                    parts.append("Probed with " + ", ".join(f"`{section}.{k}: {_yaml(v)}`"
                                                            for k, v in ctx.items()) + ".\n")
                parts.append("| value | " + " | ".join(t for t, _ in columns) + " |")
                parts.append("|---|" + "---|" * len(columns))
                for i, value in enumerate(values):
                    parts.append(f"| `{cell(_yaml(value))}` | "
                                 + " | ".join(cell(col[i]) for _, col in columns) + " |")
                parts.append("")
    return "\n".join(parts)


def _merge(columns: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Columns with the same outcome for every value become one (e.g. verl and k8s)."""
    out: list[tuple[str, list[str]]] = []
    for title, col in columns:
        for i, (other, seen) in enumerate(out):
            if seen == col:
                out[i] = (f"{other}, {title}", seen)
                break
        else:
            out.append((title, col))
    return out
