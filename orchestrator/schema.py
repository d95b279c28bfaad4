"""Schema of a grid file (pydantic, ``extra="forbid"`` everywhere: unknown keys are errors).

The schema checks shapes and types; ``grid.py`` does the semantic checks that need the recipe
and the pool catalogue (axis keys, axis values, excludes) and the expansion.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
RECIPE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_-]*(/[A-Za-z0-9_][A-Za-z0-9_-]*)*$"
KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
# A grid's ``backend:`` names: ``backends.names()``, the registry above (held equal in a test).
BACKENDS = ("sim", "verl", "miles", "k8s", "k8s-miles", "slurm", "slurm-miles")

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None
Value = Scalar | list[Scalar] | dict[StrictStr, Scalar]
DottedKey = Annotated[str, Field(pattern=KEY_PATTERN, max_length=200)]
RecipeName = Annotated[StrictStr, Field(pattern=RECIPE_PATTERN, max_length=200)]
# A searched key: a leaf, or one element of a list value (``correction.is_bounds[1]``: the IS
# upper bound; ``correction.rs_bounds[0]``: the RS band's lower edge).
SEARCH_KEY_PATTERN = KEY_PATTERN[:-1] + r"(\[[0-9]\])?$"
SearchKey = Annotated[str, Field(pattern=SEARCH_KEY_PATTERN, max_length=200)]


def _finite(value: Any) -> Any:
    """Reject NaN/inf anywhere in a value (YAML's .nan/.inf parse as floats)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    for v in value if isinstance(value, list) else value.values() if isinstance(value, dict) else ():
        _finite(v)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class CollapseRuleSpec(Strict):
    """One collapse rule over the metric stream (semantics per ``kind`` in ``orchestrator/verdict/_detectors.py``).

    ``window`` counts observations of ``metric`` (reference median for ``explode``, smoothing for
    ``blowup``/``drop_from_peak``); ``patience`` is how many consecutive observations the condition
    must hold before the rule fires; ``min_delta`` is the smallest absolute change the rule
    accepts on top of its ratio: the rise above the running median for ``explode`` and
    ``blowup``, the drop for ``drop_from_peak`` (so a ratio to a near-zero reference, e.g. grad
    norm after gradients vanish, or noise on a flat curve, is not a collapse).
    """

    name: StrictStr = Field(pattern=r"^[a-z0-9_]{1,40}$")
    metric: StrictStr = Field(max_length=200)
    kind: Literal["explode", "drop_from_peak", "above", "below", "blowup", "nonfinite"]
    threshold: StrictFloat | StrictInt = 0.0
    window: StrictInt = Field(20, ge=1, le=100_000)
    patience: StrictInt = Field(1, ge=1, le=100_000)
    min_step: StrictInt = Field(0, ge=0)
    min_delta: StrictFloat | StrictInt = Field(0.0, ge=0)
    verdict: Literal["collapsed", "unstable"] = "collapsed"

    _finite_threshold = field_validator("threshold", "min_delta")(_finite)

    @model_validator(mode="after")
    def _ratio_threshold(self) -> CollapseRuleSpec:
        # A ratio rule's threshold is a factor: "explode at 0.5x the median" fires on every
        # ordinary value, "a drop of 150% from the peak" never (and both break the recovery test).
        if self.kind in ("explode", "blowup") and self.threshold <= 1:
            article = "an" if self.kind == "explode" else "a"
            raise ValueError(f"threshold {self.threshold} of {article} {self.kind} rule is a factor over the "
                             "reference and must be > 1 (e.g. 10 for 10x the running median)")
        if self.kind == "drop_from_peak" and not 0 < self.threshold <= 1:
            raise ValueError(f"threshold {self.threshold} of a drop_from_peak rule is the share of "
                             "the peak lost and must be in (0, 1] (e.g. 0.5 for half of it)")
        return self


class EarlyWarningSpec(Strict):
    """Mismatch trend warning: the recent median of ``metric`` rises ``ratio`` x above the median
    of an older reference window (``lag`` observations back) and above ``floor``, for ``patience``
    consecutive observations. Seeds 000/002: k3 rises before grad norm and PPL blow up."""

    metric: StrictStr = Field("rollout_corr/k3_kl", max_length=200)
    ratio: StrictFloat | StrictInt = Field(3.0, gt=1)
    window: StrictInt = Field(10, ge=1, le=10_000)
    lag: StrictInt = Field(20, ge=1, le=100_000)
    floor: StrictFloat | StrictInt = Field(1e-4, ge=0)
    patience: StrictInt = Field(5, ge=1, le=100_000)
    min_step: StrictInt = Field(0, ge=0)

    _finite_values = field_validator("ratio", "floor")(_finite)


class CollapseSpec(Strict):
    rules: Literal["default", "none"] | list[CollapseRuleSpec] = "default"
    extra_rules: list[CollapseRuleSpec] = Field(default_factory=list)
    early_warning: StrictBool | EarlyWarningSpec = True

    @property
    def warning_spec(self) -> EarlyWarningSpec | None:
        """The early-warning detector, or None when it is switched off."""
        if self.early_warning is True:
            return EarlyWarningSpec()
        return self.early_warning or None


class EarlyStopSpec(Strict):
    enabled: StrictBool = True
    # A fired collapse rule must have held for ``margin`` observations in a row before the trial
    # is stopped: simulator runs often recover from grad-norm explosions and reward dips. Why 20:
    # benchmarks/early_stop.py, its figures in docs/concepts.md (no trial that recovered stopped).
    margin: StrictInt = Field(20, ge=0, le=1_000_000)
    on_warning: StrictBool = False  # also stop on early warning + margin (off by default)


Hours = Annotated[StrictFloat | StrictInt, Field(gt=0, le=1e9)]


class BudgetSpec(Strict):
    max_parallel: StrictInt = Field(4, ge=1, le=100_000)
    per_pool: dict[StrictStr, Annotated[int, Field(ge=1, le=100_000)]] = Field(default_factory=dict)
    max_trials: StrictInt = Field(100_000, ge=1)
    # Accelerator-hours the grid may spend, over all its submissions (``orchestrator.cost``):
    # GPU-hours on gpu pools, CPU-hours on sim and cpu pools; a trial whose cost does not fit
    # is not started (``scheduler._budget``).
    gpu_hours: Hours | None = None
    gpu_hours_per_pool: dict[StrictStr, Hours] = Field(default_factory=dict)


# What a comparison or adaptive seeds measure (``orchestrator.stats.seeds``; final_reward_ref:
# the final eval/reward_ref of a grid with ``eval: {reference: ...}``).
Target = Literal["collapse_rate", "final_reward", "time_to_collapse", "final_reward_ref"]


class AdaptiveSeedsSpec(Strict):
    """``seeds: {adaptive: ...}``: each cell starts with ``min`` seeds (0, 1, ...); the scheduler
    adds the next seed where the interval of ``target`` is widest or a declared comparison is
    undecided, until each cell's interval is at most ``ci_width`` wide or it has ``max`` seeds
    (``orchestrator.stats.seeds``). Intervals: Wilson score for collapse_rate, Student t (logit scale
    for a reward in [0, 1]) for final_reward, the restricted mean survival time up to ``steps``
    for time_to_collapse (its width as a share of ``steps``), all at ``level``."""

    min: StrictInt = Field(2, ge=1, le=10_000)
    max: StrictInt = Field(10, ge=1, le=10_000)
    target: Target = "collapse_rate"
    ci_width: StrictFloat | StrictInt = 0.3
    level: StrictFloat = Field(0.95, ge=0.5, le=0.999)

    @field_validator("ci_width")
    @classmethod
    def _width(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 < v < 1):
            raise ValueError(f"ci_width {v} must be inside (0, 1) (a collapse rate or a reward "
                             "on a 0-1 scale); fix: e.g. 0.3")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveSeedsSpec:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; fix: min <= max")
        return self

    @property
    def seeds(self) -> list[int]:
        """Every seed a cell may get, in the order they are added."""
        return list(range(self.max))


class SeedsSpec(Strict):
    adaptive: AdaptiveSeedsSpec


SeedList = Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1)]


def _seeds_form(value: Any) -> str:
    # A mapping is the adaptive form; anything else is checked as the list (errors name it).
    return "adaptive" if isinstance(value, (dict, SeedsSpec)) else "list"


class CompareDecl(Strict):
    """A comparison the grid declares: every other value of ``axis`` against ``baseline``
    (with the other axes equal); ``ablate compare`` reports its difference and interval and
    adaptive seeds go where it is undecided. ``target``: only on that target; ``margin``: also an
    equivalence test (TOST) at +-margin on the target's scale (needs a target); ``paired``: the
    arms share their seeds' task draws, compare the final reward seed by seed."""

    axis: StrictStr = Field(max_length=200)
    baseline: Scalar
    target: Target | None = None
    margin: StrictFloat | StrictInt | None = None
    paired: StrictBool = False


# The metrics a grid may declare a range for: ``reward`` is the reward metric the tables and
# the ``final_reward`` target read (eval/reward, else critic/score/mean), final and peak alike.
RANGED_METRICS = ("reward",)
DEFAULT_RANGE = (0.0, 1.0)  # a verifiable task's reward (GSM8K, the simulator): right or wrong


class MetricsSpec(Strict):
    """What the grid declares about its metrics. ``range``: the interval a metric's values lie
    in, which its per-cell intervals then stay inside (``orchestrator.stats.intervals.bounded_mean``);
    undeclared: ``DEFAULT_RANGE``."""

    range: dict[Literal["reward"], Annotated[list[StrictFloat | StrictInt],
                                             Field(min_length=2, max_length=2)]] = Field(default_factory=dict)

    @field_validator("range")
    @classmethod
    def _ordered(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for metric, (lo, hi) in v.items():
            _finite([lo, hi])
            if not lo < hi:
                raise ValueError(f"{metric}: low {lo} must be below high {hi}, e.g. [{lo}, {lo + 1}]")
        return v

    def bounds(self, metric: str = "reward") -> tuple[float, float]:
        lo, hi = self.range.get(metric, DEFAULT_RANGE)  # type: ignore[call-overload]
        return float(lo), float(hi)


class RetrySpec(Strict):
    max: StrictInt = Field(2, ge=0, le=100)
    # Preemptions a trial survives on top of `max` (a busy cluster reclaims nodes often).
    preemptions: StrictInt = Field(20, ge=0, le=10_000)


class CheckpointSpec(Strict):
    every: StrictInt = Field(25, ge=1, le=10_000_000)
    keep: StrictInt = Field(3, ge=1, le=1000)
    store: StrictStr | None = Field(None, max_length=1000)  # local path or fsspec URL
    # `ablate resume --from last-healthy` takes the newest checkpoint strictly before
    # (verdict step - healthy_margin): the onset a rule reports can lag the real damage.
    healthy_margin: StrictInt = Field(0, ge=0, le=10_000_000)


class TrackingSpec(Strict):
    """How much of each trial's metric stream goes to MLflow (``metrics.jsonl`` keeps every step)."""

    # MLflow gets every N-th step, plus each checkpoint's step, the last step and every step a
    # collapse rule or the early warning can name (onsets, fire steps), so no verdict loses its
    # point; the tables come from the per-trial summary either way (docs/scale.md).
    every: StrictInt = Field(1, ge=1, le=10_000_000)


class EvalSpec(Strict):
    """``eval: {reference: ...}``: one evaluator scores every arm, as ``eval/reward_ref``
    (``orchestrator/evaluation.py``: trainer, the fp32 trainer-side model; engine, verl's
    validation of each checkpoint by a fixed engine ``rollout`` on one named ``pool``)."""

    reference: Literal["trainer", "engine"] | None = None  # the evaluator; null: own eval only
    pool: StrictStr | None = None  # engine: the evaluation pool its job runs on (cpu or gpu)
    rollout: dict[StrictStr, Any] | None = None  # engine: its engine settings (rollout.* keys)


class SearchParam(Strict):
    low: StrictFloat | StrictInt
    high: StrictFloat | StrictInt
    log: StrictBool = False
    kind: Literal["float", "int"] = "float"

    @model_validator(mode="after")
    def _range(self) -> SearchParam:
        _finite([self.low, self.high])
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale range needs low > 0")
        return self


class SearchObjective(Strict):
    metric: StrictStr = "eval/reward/final"
    mode: Literal["max", "min"] = "max"
    collapse_penalty: StrictFloat | StrictInt = 1.0


class SearchSpec(Strict):
    params: dict[SearchKey, SearchParam] = Field(min_length=1)
    budget: StrictInt = Field(16, ge=1, le=100_000)
    objective: SearchObjective = Field(default_factory=SearchObjective)
    sampler: Literal["tpe", "random"] = "tpe"


class ResumeAction(Strict):
    pool: StrictStr | None = None
    set: dict[DottedKey, Value] = Field(default_factory=dict)
    start: Literal["last-healthy", "latest"] = "last-healthy"


class OnCollapseSpec(Strict):
    """``on_collapse: {resume: ...}``: the one-entry rescue policy ``[{when: collapsed, resume: ...}]``."""

    resume: ResumeAction


class WarningWhen(Strict):
    # ``early_warning`` (the trend detector) or a collapse rule whose verdict is ``unstable``.
    warning: StrictStr = Field(max_length=40)


class RescueEntry(Strict):
    """One entry of a grid's ``rescue:`` list (``scheduler._rescue``): on ``when``, resume."""

    when: Literal["collapsed", "infra_failed"] | WarningWhen
    resume: ResumeAction
    times: StrictInt = Field(1, ge=1, le=100)  # rescues of one trial by this entry
    of_rescues: StrictBool = False  # also rescue a trial that is itself a rescue

    @property
    def event(self) -> str:
        """``collapsed``, ``infra_failed`` or ``warning:RULE``."""
        return self.when if isinstance(self.when, str) else f"warning:{self.when.warning}"

    @property
    def warning(self) -> str | None:
        return None if isinstance(self.when, str) else self.when.warning


class PreflightSpec(Strict):
    """``preflight:``: ``ablate submit`` probes the configurations first (``orchestrator.probe``);
    one beyond a ``gate`` bound (a number: at most; ``">=0.9"``: at least) refuses the submission,
    or (``on_fail: skip``) leaves its trials not started, the reason in their records."""

    probe: StrictBool = True
    gate: dict[StrictStr, StrictFloat | StrictInt | StrictStr] = Field(min_length=1)
    on_fail: Literal["refuse", "skip"] = "refuse"


NotifyEvent = Literal["collapsed", "warning", "infra_failed", "rescued", "budget_exhausted", "grid_done"]
NOTIFY_EVENTS = get_args(NotifyEvent)


class NotifySpec(Strict):
    """One webhook of a grid's ``notify:`` list (``scheduler._notify``). The URL is read from
    the environment variable ``url_env`` when an event is sent, so it is never in the grid, the
    records, the results, the logs or MLflow."""

    url_env: StrictStr = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS), min_length=1)
    min_interval_s: StrictFloat | StrictInt = Field(1.0, ge=0, le=3600)  # rate limit: seconds between sends
    timeout_s: StrictFloat | StrictInt = Field(5.0, gt=0, le=60)  # one request's timeout
    max_tries: StrictInt = Field(8, ge=1, le=100)  # then the event is given up (kept as failed)


class GridFile(Strict):
    """Top level of ``grids/*.yaml``."""

    name: StrictStr = Field(pattern=NAME_PATTERN)
    description: StrictStr = ""
    recipe: RecipeName | dict[StrictStr, RecipeName]  # or by trainer: load_grid picks the backend's
    recipes_dir: StrictStr | None = Field(default=None, max_length=4096)
    backend: Literal[BACKENDS] = "sim"  # type: ignore[valid-type]  # backends.names(), tested
    steps: StrictInt = Field(ge=1, le=10_000_000)
    seeds: Annotated[
        Annotated[SeedList, Tag("list")] | Annotated[SeedsSpec, Tag("adaptive")],
        Discriminator(_seeds_form)] = [0]
    pool: StrictStr | None = None
    pool_catalog: StrictStr | None = None
    axes: dict[StrictStr, list[Value] | dict[StrictStr, dict[DottedKey, Value] | None]] = Field(
        default_factory=dict
    )
    overrides: dict[DottedKey, Value] = Field(default_factory=dict)
    exclude: list[dict[StrictStr, Value]] = Field(default_factory=list)
    include: list[dict[StrictStr, Value]] = Field(default_factory=list)
    collapse: CollapseSpec = Field(default_factory=CollapseSpec)
    early_stop: StrictBool | EarlyStopSpec = True
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    search: SearchSpec | None = None
    on_collapse: OnCollapseSpec | None = None
    preflight: PreflightSpec | None = None
    rescue: list[RescueEntry] | None = Field(default=None, min_length=1, max_length=20)
    notify: list[NotifySpec] = Field(default_factory=list, max_length=10)
    compare: CompareDecl | list[CompareDecl] | None = None
    # How the p-values of the declared comparisons are adjusted (orchestrator.stats.hypotheses).
    multiplicity: Literal["holm", "bh", "none"] = "holm"
    # What the grid declares about its metrics: the range a bounded one lies in.
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)

    _finite_overrides = field_validator("overrides")(_finite)

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int] | SeedsSpec) -> list[int] | SeedsSpec:
        if isinstance(v, list) and len(set(v)) != len(v):
            raise ValueError(f"seeds must be unique, got {v}")
        return v

    @model_validator(mode="after")
    def _one_rescue_key(self) -> GridFile:
        if self.on_collapse is not None and self.rescue is not None:
            raise ValueError("on_collapse and rescue both given: on_collapse is the one-entry "
                             "shorthand of rescue; fix: move it into the rescue list as "
                             "{when: collapsed, resume: ...}")
        return self

    @property
    def rescue_policy(self) -> tuple[RescueEntry, ...]:
        """The ordered rescue list; ``on_collapse: X`` is ``[{when: collapsed, resume: X.resume}]``."""
        if self.on_collapse is not None:
            return (RescueEntry(when="collapsed", resume=self.on_collapse.resume),)
        return tuple(self.rescue or ())

    @property
    def rescue_key(self) -> str:
        """The grid key the rescue policy was written under (for messages and line numbers)."""
        return "on_collapse" if self.on_collapse is not None else "rescue"

    @property
    def seed_values(self) -> list[int]:
        """The seeds a cell may run: the list, or ``0 .. max-1`` of an adaptive block (so an
        adaptive seed is the trial that listing it would give, with the same id)."""
        return self.seeds.adaptive.seeds if isinstance(self.seeds, SeedsSpec) else list(self.seeds)

    @property
    def adaptive(self) -> AdaptiveSeedsSpec | None:
        return self.seeds.adaptive if isinstance(self.seeds, SeedsSpec) else None

    @property
    def comparisons(self) -> list[CompareDecl]:
        if self.compare is None:
            return []
        return self.compare if isinstance(self.compare, list) else [self.compare]

    @property
    def early_stop_spec(self) -> EarlyStopSpec:
        if isinstance(self.early_stop, bool):
            return EarlyStopSpec(enabled=self.early_stop)
        return self.early_stop
