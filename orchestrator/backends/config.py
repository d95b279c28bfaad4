"""One trial's configuration, typed and frozen: what the grid resolved, what every launcher
carries and what a trainer receives.

``TrialConfig.resolve`` is the one place a trial's configuration is built from its recipe and
overrides (``grid.GridSpec.trial_config`` and a Ray worker's ``scheduler._trainable`` call it),
and ``TrialConfig.from_json`` the one place it is read back at an edge (a Slurm job's file);
both validate the typed sections once, so the settings a trial records and the settings its
trainer receives are one object. A trainer reads the typed sections as attributes
(``config.correction``, ``config.rollout``, ``config.learner``), its own leaves as a read-only
mapping (``config["model"]``, ``config.get("trainer")``), and the pool the attempt runs on
beside them. The seed is the trial's (``TrialSpec.seed``), not the configuration's: the seeds of
a cell share one configuration, as they share its ``config`` id.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

from orchestrator import recipes
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.learner import LearnerSpec
from orchestrator.pools import PoolSpec


class _ReadOnly(dict):  # type: ignore[type-arg]
    """A mapping of the resolved recipe that no caller can change (a dict, so JSON, OmegaConf
    and pickling take it as one)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a trial's configuration is read-only; fix: TrialConfig.updated(...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ReadOnly, (dict(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return _plain(self)  # a copy is the caller's to change


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _ReadOnly({str(k): _frozen(v) for k, v in value.items()})
    if isinstance(value, list):  # lists stay lists: verl's overrides print them as lists
        return [_frozen(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True, eq=False)
class TrialConfig(Mapping[str, Any]):
    """A trial's resolved configuration on the pool one attempt of it runs on.

    As a mapping it is the resolved recipe (every section, read-only); ``correction``,
    ``rollout`` and ``learner`` are its typed sections, validated once (the correction in its
    canonical form, as trial ids hash it)."""

    recipe: Mapping[str, Any]
    correction: CorrectionSpec
    rollout: RolloutSpec
    learner: LearnerSpec
    pool: PoolSpec

    @classmethod
    def resolve(cls, recipe: Mapping[str, Any], overrides: Mapping[str, Any],
                pool: PoolSpec) -> TrialConfig:
        """The configuration of ``recipe`` with a trial's dotted-key ``overrides`` applied."""
        return cls.of(recipes.apply_overrides(recipe, overrides), pool)

    @classmethod
    def of(cls, resolved: Mapping[str, Any], pool: PoolSpec) -> TrialConfig:
        """The configuration of an already resolved recipe (its sections validated here)."""
        return cls(recipe=_frozen(resolved),
                   correction=CorrectionSpec.model_validate(
                       _plain(resolved.get("correction") or {})).canonical(),
                   rollout=RolloutSpec.model_validate(_plain(resolved.get("rollout") or {})),
                   learner=LearnerSpec.model_validate(_plain(resolved.get("learner") or {})),
                   pool=pool)

    def updated(self, overrides: Mapping[str, Any] | None = None, *,
                pool: PoolSpec | None = None) -> TrialConfig:
        """This configuration with dotted-key ``overrides`` set (validated again) or on another
        pool."""
        recipe = recipes.apply_overrides(self.recipe, overrides) if overrides else self.recipe
        return TrialConfig.of(recipe, pool or self.pool)

    # ------------------------------------------------------------------ the recipe, read-only

    def __getitem__(self, key: str) -> Any:
        return self.recipe[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.recipe)

    def __len__(self) -> int:
        return len(self.recipe)

    # ------------------------------------------------------------------ the edges

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: the resolved recipe and the pool's definition (a Slurm job's file);
        :meth:`from_json` reads it back."""
        return {"recipe": _plain(self.recipe), "pool": self.pool.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialConfig:
        return cls.of(data["recipe"], PoolSpec.model_validate(data["pool"]))
