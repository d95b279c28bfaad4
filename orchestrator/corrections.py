"""The mismatch-correction vocabulary shared by every backend (its math on tensors is
``orchestrator/sim/correction_math.py``).

One vocabulary (a superset of Miles ``mis.yaml`` and verl 0.6-0.9, see
``research/corrections.md``) is declared in grids under ``correction.*``:

=================  ==========================================================================
key                meaning
=================  ==========================================================================
is_level           none | token | sequence | geometric: how the IS log-ratio is aggregated
is_mode            truncate (TIS, clamp above) | clip (clamp both sides) | mask (IcePop band)
is_bounds          [lo, hi] on the IS ratio; lo null means 1/hi
rs                 off | token | sequence | geometric: rejection sampling level
rs_bounds          [lo, hi] for RS; null means the IS bounds
rs_filters         {verl option: threshold}, e.g. {seq_mean_k3: 0.01, token_k1: "0.5_2.0"}
veto               per-token veto threshold on pi_old/mu (reject the sequence), or null
batch_norm         self-normalise IS weights to mean 1 over the batch
policy             decoupled (3-policy: pi_theta, pi_old, mu) | bypass (2-policy: pi_old := mu)
loss_type          ppo_clip | reinforce (bypass only)
denominator        renormalized (verl: token-mean over surviving tokens) | original (Miles)
opsm               DeepSeek-V3.2 off-policy sequence masking delta, or null
routing_replay     off | R2 | R3 (MoE only)
preset             one of verl 0.9.1's named RolloutCorrectionConfig presets (``PRESETS``),
                   expanded into the keys above; a key set beside it must agree with it
=================  ==========================================================================

The math follows Miles ``mis.py`` and verl's ``rollout_corr_helper``. For every
specification the verl backend accepts, the weights, loss mask and denominator mask equal verl
0.9.1's (``tests/backends/test_correction_parity.py`` runs the whole matrix through verl's own
helper). Where the references disagree or are silent, this vocabulary decides, explicitly:

- ``is_mode: mask`` zeroes the weight outside [lo, hi] and leaves the loss mask alone (verl's
  IcePop). Miles keeps the raw weight and drops the token from the mask but not from the
  denominator: the same loss without ``batch_norm``, a different one with it (next item).
- ``batch_norm`` divides by the batch mean of the weights *after* truncation or masking (verl),
  so in mask mode out-of-band tokens count as 0 in the mean. Miles' ``compute_mis_weights``
  averages the raw weights, out-of-band ones included (up to e^20), so its weights come out
  smaller by mean(raw) / mean(masked) >= 1: 1 when nothing is out of band, 1.06 at token level
  with 4% of the tokens out of [0.5, 2], ~1e7 as soon as one token reaches e^20. Not offered as
  an option: that factor is set by exactly the tokens the mask exists to ignore.
- ``batch_norm`` at geometric level normalises the per-sequence weights like sequence level
  (Miles raises).
- ``rs`` is verl's k1 rejection at that level (token_k1 / seq_sum_k1 / seq_mean_k1) with
  ``rs_bounds`` turned into verl's direction (:func:`rejection_rules`): every token's
  log-ratio is clamped to +-20 *before* it is summed or averaged, as in the ``rs_filters``.
- ``veto`` applies whether or not RS is on (Miles only vetoes inside its RS path).
- ``denominator``: ``renormalized`` divides by the tokens surviving RS/filters/veto (verl's
  decoupled mode), ``original`` by all response tokens (Miles, and verl's bypass mode, whose
  loss rejects tokens after the engine has counted them): rejected tokens shrink the gradient.
- Masked positions (padding, multi-turn holes) never reach a sum, a mean or a weight, even when
  they hold NaN or inf: ``correction_math._masked_sum`` selects, it does not multiply (as verl
  does).
- An update with no token left in its loss (all rejected, or none generated) is not taken:
  ``correction_math.empty_update`` says why and the simulator fails the attempt as a numeric
  failure, as a verl job ends up doing (its helper raises on an empty batch; its token mean is
  then 0/0).
- ``opsm`` masks a sequence when A < 0 and mean_t log(mu / pi_theta) > delta (mu: the engine's
  sampling probability, as in DeepSeek-V3.2).
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

IS_LEVELS = ("none", "token", "sequence", "geometric")
IS_MODES = ("truncate", "clip", "mask")
RS_LEVELS = ("off", "token", "sequence", "geometric")
RS_FILTER_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
SAFETY_BOUND = 20.0  # log-ratio clamp used by Miles and verl
# ``rs`` levels as verl's k1 rejection options (k1 = -log ratio, clamped per token).
RS_LEVEL_OPTION = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


# verl 0.9.1's ``RolloutCorrectionConfig`` classmethod presets (defaults of their arguments), as
# this vocabulary: (description, fields). verl's k1 thresholds stay verbatim as rs_filters, so
# the verl mapping emits exactly verl's option and band (tests/test_correction_presets.py checks
# every preset against verl's classmethod, key by key). A preset sets every key verl decides
# (``_PRESET_KEYS``: unnamed ones at their defaults);
# note the trap: ``RolloutCorrectionConfig()`` itself defaults to sequence IS, the presets and
# this vocabulary to none.
_GEO = {"seq_mean_k1": "0.999_1.001"}
_K3 = {"seq_mean_k3": 0.01}
_BYPASS_PG = {"policy": "bypass", "loss_type": "reinforce"}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "disabled": ("metrics only, no correction", {}),
    "decoupled_token_is": ("token TIS at 2", {"is_level": "token"}),
    "decoupled_seq_is": ("sequence TIS at 2", {"is_level": "sequence"}),
    "decoupled_token_icepop": ("token IcePop: weights outside [0.5, 5] set to 0",
                               {"is_level": "token", "is_mode": "mask", "is_bounds": [0.5, 5.0]}),
    "decoupled_seq_is_rs": ("sequence TIS at 2 + sequence-sum k1 RS in [0.5, 2] (seq-MIS)",
                            {"is_level": "sequence", "rs_filters": {"seq_sum_k1": "0.5_2.0"}}),
    "decoupled_geo_rs": ("geometric RS: sequence-mean k1 in [0.999, 1.001]", {"rs_filters": _GEO}),
    "decoupled_geo_rs_seq_tis": ("geometric RS + sequence TIS at 2",
                                 {"is_level": "sequence", "rs_filters": _GEO}),
    "decoupled_geo_rs_token_tis": ("geometric RS + token TIS at 2",
                                   {"is_level": "token", "rs_filters": _GEO}),
    "decoupled_k3_rs": ("sequence-mean k3 RS at 0.01", {"rs_filters": _K3}),
    "decoupled_k3_rs_seq_tis": ("k3 RS + sequence TIS at 2",
                                {"is_level": "sequence", "rs_filters": _K3}),
    "decoupled_k3_rs_token_tis": ("k3 RS + token TIS at 2", {"is_level": "token", "rs_filters": _K3}),
    "bypass_ppo_clip": ("bypass, PPO-clip on pi_theta / mu", {"policy": "bypass"}),
    "bypass_ppo_clip_geo_rs": ("bypass PPO-clip + geometric RS",
                               {"policy": "bypass", "rs_filters": _GEO, "denominator": "original"}),
    "bypass_ppo_clip_k3_rs": ("bypass PPO-clip + k3 RS",
                              {"policy": "bypass", "rs_filters": _K3, "denominator": "original"}),
    "bypass_pg_is": ("bypass REINFORCE + sequence TIS at 2", {**_BYPASS_PG, "is_level": "sequence"}),
    "bypass_pg_token_icepop": ("bypass REINFORCE + token IcePop [0.5, 5]",
                               {**_BYPASS_PG, "is_level": "token", "is_mode": "mask",
                                "is_bounds": [0.5, 5.0]}),
    "bypass_pg_geo_rs": ("bypass REINFORCE + geometric RS",
                         {**_BYPASS_PG, "rs_filters": _GEO, "denominator": "original"}),
    "bypass_pg_geo_rs_seq_tis": ("bypass REINFORCE + geometric RS + sequence TIS",
                                 {**_BYPASS_PG, "is_level": "sequence", "rs_filters": _GEO,
                                  "denominator": "original"}),
    "bypass_pg_geo_rs_token_tis": ("bypass REINFORCE + geometric RS + token TIS",
                                   {**_BYPASS_PG, "is_level": "token", "rs_filters": _GEO,
                                    "denominator": "original"}),
}


def expand_preset(raw: Any) -> Any:
    """A raw correction mapping with ``preset`` expanded into the fields it sets.

    A field given beside the preset must equal the preset's value or its own default (the
    grid loader fills every default in): anything else would silently lose one of the two.
    """
    preset = raw.get("preset") if isinstance(raw, dict) else None
    if not isinstance(preset, str) or preset not in PRESETS:
        # No preset, an unknown name or not a name at all (a list, a mapping): the field's
        # own validator refuses it with the allowed names.
        return raw
    name = raw["preset"]
    fields = preset_fields(name)
    out = dict(raw)
    for key, value in fields.items():
        given = raw.get(key)
        default = CorrectionSpec.model_fields[key].get_default(call_default_factory=True)
        same = _norm(given) in (_norm(value), _norm(default)) or key not in raw
        if not same:
            raise ValueError(f"correction.{key}: {_show_any(given)} conflicts with correction."
                             f"preset: {name}, which sets {_show_any(value)}; fix: drop one of them")
        out[key] = value
    return out


# Every key a verl preset decides (its seven rollout_correction values and the denominator
# verl then computes): a preset sets all of them, so nothing beside it can change what it means.
_PRESET_KEYS = {"is_level": "none", "is_mode": "truncate", "is_bounds": [0.5, 2.0], "rs": "off",
                "rs_bounds": None, "rs_filters": {}, "batch_norm": False, "policy": "decoupled",
                "loss_type": "ppo_clip", "denominator": "renormalized"}


def preset_fields(name: str) -> dict[str, Any]:
    """All the correction fields preset ``name`` sets."""
    return {**_PRESET_KEYS, **PRESETS[name][1]}


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _show_any(value: Any) -> str:
    return value if isinstance(value, str) else _show(value) if not isinstance(value, dict) else str(value)


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "null" if value is None else f"{value:g}"


def _check_bounds(value: tuple[float | None, float] | None, name: str) -> None:
    if value is None:
        return
    lo, hi = value
    for v in (lo, hi):
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise ValueError(f"{name} must be finite and > 0, got {list(value)}")
    if lo is not None and lo > hi:
        raise ValueError(f"{name} lower bound {lo} is above the upper bound {hi}")


def band(bounds: tuple[float | None, float], key: str, effect: str = "") -> tuple[float, float]:
    """(lo, hi) of a bounds pair whose null lower bound means 1/hi.

    An implied lower bound above the upper one (hi < 1) is an empty band: ValueError, one line
    naming ``correction.<key>``, the value, the implied bound, ``effect`` and the fix.
    """
    lo, hi = bounds
    if lo is not None:
        return lo, hi
    if 1.0 / hi > hi:
        raise ValueError(
            f"correction.{key} {_show(list(bounds))}: the implied lower bound 1/{hi:g} = "
            f"{1.0 / hi:g} is above the upper bound {hi:g}{effect}; fix: correction.{key}: "
            f"[lo, {hi:g}] with lo <= {hi:g}, or an upper bound >= 1")
    return 1.0 / hi, hi


def parse_lo_hi(threshold: str | float | tuple[float, float]) -> tuple[float, float]:
    """verl's k1 threshold: ``"lo_hi"``, a bare upper bound (lo = 1/hi) or a (lo, hi) pair."""
    if isinstance(threshold, tuple):
        lo, hi = threshold
    elif isinstance(threshold, str) and "_" in threshold:
        lo_s, hi_s = threshold.split("_", 1)
        lo, hi = float(lo_s), float(hi_s)
    else:
        hi = float(threshold)
        if math.isfinite(hi) and 0 < hi < 1:
            raise ValueError(f"{threshold!r} is a k1 upper bound whose implied lower bound "
                             f"1/{hi:g} = {1.0 / hi:g} is above it, so every token would be "
                             f"rejected; fix: 'lo_{hi:g}' with lo <= {hi:g}, or an upper bound >= 1")
        lo = 1.0 / hi if hi > 0 else math.nan
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or lo > hi:
        raise ValueError(f"threshold {threshold!r} must be 'lo_hi' with 0 < lo <= hi")
    return lo, hi


class CorrectionSpec(BaseModel):
    """One point of the correction matrix, validated; ``canonical()`` drops irrelevant fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    is_level: Literal["none", "token", "sequence", "geometric"] = "none"
    is_mode: Literal["truncate", "clip", "mask"] = "truncate"
    is_bounds: tuple[float | None, float] = (0.5, 2.0)
    rs: Literal["off", "token", "sequence", "geometric"] = "off"
    rs_bounds: tuple[float | None, float] | None = None
    rs_filters: dict[str, str | float] = Field(default_factory=dict)
    veto: float | None = None
    batch_norm: bool = False
    policy: Literal["decoupled", "bypass"] = "decoupled"
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"
    denominator: Literal["renormalized", "original"] = "renormalized"
    opsm: float | None = None
    routing_replay: Literal["off", "R2", "R3"] = "off"
    preset: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, raw: Any) -> Any:
        return expand_preset(raw)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            import difflib

            near = difflib.get_close_matches(v, list(PRESETS), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"unknown preset {v!r}; {hint}verl 0.9.1's presets: "
                             f"{', '.join(PRESETS)}")
        return v

    @field_validator("is_bounds", "rs_bounds", mode="before")
    @classmethod
    def _bounds_from_list(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("rs_filters")
    @classmethod
    def _filters(cls, v: dict[str, str | float]) -> dict[str, str | float]:
        for opt, thr in v.items():
            if opt not in RS_FILTER_OPTIONS:
                raise ValueError(f"rs_filters option {opt!r} is not one of {list(RS_FILTER_OPTIONS)}")
            if opt.endswith("_k1"):
                try:
                    parse_lo_hi(thr)
                except ValueError as exc:
                    raise ValueError(f"correction.rs_filters.{opt}: {exc}") from None
            elif isinstance(thr, str) or not (math.isfinite(thr) and thr > 0):
                raise ValueError(f"rs_filters.{opt} takes one positive upper bound, got {thr!r}")
        return v

    @model_validator(mode="after")
    def _semantics(self) -> CorrectionSpec:
        _check_bounds(self.is_bounds, "is_bounds")
        _check_bounds(self.rs_bounds, "rs_bounds")
        # An implied lower bound (null -> 1/hi) above the upper one is an empty band; refused
        # where a lower bound is used (truncation uses only the upper bound).
        if self.rs != "off" and self.rs_bounds is None:
            band(self.is_bounds, "is_bounds", ", and RS uses the IS bounds while rs_bounds is "
                 "null, so it would reject every token")
        elif self.is_level != "none" and self.is_mode in ("mask", "clip"):
            band(self.is_bounds, "is_bounds", f", so {self.is_mode} mode would " + (
                "zero every weight" if self.is_mode == "mask"
                else f"set every weight to {self.is_hi:g}"))
        if self.rs != "off" and self.rs_bounds is not None:
            band(self.rs_bounds, "rs_bounds", ", so RS would reject every token")
        if self.veto is not None and not (math.isfinite(self.veto) and 0 < self.veto < 1):
            raise ValueError(f"veto must be in (0, 1), got {self.veto}")
        if self.opsm is not None and not (math.isfinite(self.opsm) and self.opsm >= 0):
            raise ValueError(f"opsm must be a finite delta >= 0, got {self.opsm}")
        if self.loss_type == "reinforce" and self.policy != "bypass":
            raise ValueError("loss_type reinforce only applies with policy: bypass")
        return self

    @property
    def is_lo(self) -> float:
        lo, hi = self.is_bounds
        return 1.0 / hi if lo is None else lo

    @property
    def is_hi(self) -> float:
        return self.is_bounds[1]

    @property
    def rs_lo_hi(self) -> tuple[float, float]:
        """The RS band on the ratio pi_old/mu: rs_bounds, else the IS bounds."""
        return band(self.is_bounds if self.rs_bounds is None else self.rs_bounds, "rs_bounds")

    def canonical(self) -> CorrectionSpec:
        """Reset fields that cannot change the result, so equivalent configs hash the same."""
        default = CorrectionSpec()
        # A preset is only a name for the fields it set: it hashes like those fields.
        update: dict[str, Any] = {"preset": None} if self.preset is not None else {}
        if self.is_level == "none":
            update.update(is_mode=default.is_mode, batch_norm=False)
            if self.rs == "off":
                update["is_bounds"] = default.is_bounds
        if self.rs == "off":
            update["rs_bounds"] = None
        if self.policy == "decoupled":
            update["loss_type"] = default.loss_type
        return self.model_copy(update=update) if update else self

    def non_default(self) -> dict[str, Any]:
        """Fields that differ from the defaults, as JSON-safe values (for overrides and hashing)."""
        out: dict[str, Any] = {}
        for name, value in self:
            if value != CorrectionSpec.model_fields[name].get_default(call_default_factory=True):
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


def rejection_rules(spec: CorrectionSpec) -> list[tuple[str, str | float | tuple[float, float]]]:
    """RS and filters as verl rejection options with their thresholds, in the order given to
    verl: the ``rs`` level first, as its k1 option with the band turned into verl's direction
    (k1 = -log ratio, so keeping the ratio in [lo, hi] keeps k1 in [log 1/hi, log 1/lo]), then
    the filters by name. The simulator rejects with these and the verl mapping emits them."""
    rules: list[tuple[str, str | float | tuple[float, float]]] = []
    if spec.rs != "off":
        lo, hi = spec.rs_lo_hi
        rules.append((RS_LEVEL_OPTION[spec.rs], (1.0 / hi, 1.0 / lo)))
    return rules + sorted(spec.rs_filters.items())
