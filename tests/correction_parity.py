"""Parity harness: the simulator's correction math against verl 0.9.1's own helper.

Every point of the correction matrix (IS level x mode x bounds x BN x RS x veto x denominator x
policy x filters, enumerated from the vocabulary of ``CorrectionSpec``) is classified as invalid
(``CorrectionSpec`` refuses it at plan time), refused by the verl backend
(``mapping.check_correction``) or allowed. Each allowed point is mapped with
``mapping.correction_settings``, run through verl's
``compute_rollout_correction_and_rejection_mask`` and compared with
``correction_math.apply_correction`` on generated batches.

What verl does with the helper's output is fixed here from verl 0.9.1's source, not taken from
the mapping (which is what is under test):

* decoupled: the trainer applies the weights when ``rollout_is`` is set and replaces
  ``response_mask`` by the helper's mask before the update; the engine counts that mask for the
  token-mean denominator (``trainer/ppo/v1/trainer_base.py`` ``_compute_advantage``,
  ``workers/engine/fsdp/transformer_impl.py`` ``forward_backward_batch``);
* bypass: the loss calls the helper with old = pi_theta (which is this call with ``old`` playing
  pi_theta), applies the weights only with ``loss_type: reinforce``, masks with the helper's
  mask, and divides by ``batch_num_tokens``, which the engine counted on the mini-batch's
  response mask *before* the loss ran: the original tokens (``core_algos.py``
  ``compute_policy_loss_bypass_mode``, ``agg_loss``).

Only the public names ``CorrectionSpec``, ``apply_correction``, ``is_weights``,
``mapping.check_correction`` and ``mapping.correction_settings`` are used, so the same harness
counts the disagreements of an older checkout (``run(classify().allowed, batches())`` groups them
by input kind: plain, extreme log-ratios, non-finite padding; fp32 and bf16).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import typing
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import ValidationError

from orchestrator import corrections
from orchestrator.corrections import CorrectionSpec
from orchestrator.sim import correction_math
from orchestrator.verl import mapping

RTOL = 1e-5
B, R = 24, 16  # rows x response positions of a generated batch
EMPTY_ROWS = (0, 13)  # every token masked
HOLE_ROWS = (3, 4, 5, 6, 7, 8)  # multi-turn: a masked span inside the response

# Values for the axes that are not plain enumerations. IS bounds: asymmetric explicit, implied
# lower bound (1/hi), and an implied lower bound above the upper one (a hole).
IS_BOUNDS: tuple[Any, ...] = ([0.5, 3.0], [None, 2.0], [None, 0.5])
# RS bounds that bite at each level on these batches (sequence sums spread more than means).
RS_BOUNDS = {"token": [0.4, 2.5], "sequence": [0.25, 3.0], "geometric": [0.9, 1.15]}
RS_BOUND_VARIANTS: tuple[Any, ...] = ("level", None)  # None: RS uses the IS bounds
# One threshold per filter kind (k1 in verl's direction, pi_rollout/pi_train).
FILTER_THRESHOLD = {"k1": "0.5_2.0", "token_k2": 0.1, "token_k3": 0.08, "seq_sum_k2": 0.6,
                    "seq_sum_k3": 0.6, "seq_mean_k2": 0.05, "seq_mean_k3": 0.05,
                    "seq_max_k2": 0.3, "seq_max_k3": 0.3}
EXTRA_FILTERS: tuple[dict[str, Any], ...] = (
    {"token_k1": "0.4_3.0"},  # asymmetric k1 band
    {"seq_mean_k1": 1.1},  # bare k1 upper bound: lower = 1/1.1
    {"seq_max_k3": 0.5, "token_k2": 0.12, "seq_sum_k1": "0.3_3.0"},  # AND of three
)
VETO = (None, 1e-4)


def _literals(field: str) -> tuple[Any, ...]:
    return typing.get_args(CorrectionSpec.model_fields[field].annotation)


def filter_sets() -> list[dict[str, Any]]:
    """No filter, each verl filter option alone, and the extra combinations."""
    out: list[dict[str, Any]] = [{}]
    for opt in corrections.RS_FILTER_OPTIONS:
        kind = "k1" if opt.endswith("_k1") else opt
        out.append({opt: FILTER_THRESHOLD[kind]})
    return out + [dict(f) for f in EXTRA_FILTERS]


def matrix() -> Iterator[dict[str, Any]]:
    """Every raw point of the correction matrix (before validation)."""
    rs_points: list[tuple[str, Any]] = []
    for rs in _literals("rs"):
        if rs == "off":
            rs_points.append((rs, None))
            continue
        for variant in RS_BOUND_VARIANTS:
            rs_points.append((rs, RS_BOUNDS[rs] if variant == "level" else variant))
    for (level, mode, bounds, bn, (rs, rs_bounds), filters, veto, denom, policy,
         loss) in itertools.product(
            _literals("is_level"), _literals("is_mode"), IS_BOUNDS, (False, True), rs_points,
            filter_sets(), VETO, _literals("denominator"), _literals("policy"),
            _literals("loss_type")):
        yield {"is_level": level, "is_mode": mode, "is_bounds": bounds, "batch_norm": bn,
               "rs": rs, "rs_bounds": rs_bounds, "rs_filters": filters, "veto": veto,
               "denominator": denom, "policy": policy, "loss_type": loss}


@dataclasses.dataclass
class Classified:
    allowed: dict[str, CorrectionSpec]  # canonical label -> spec
    refused: dict[str, tuple[CorrectionSpec, str]]  # label -> (spec, refusal)
    invalid: dict[str, str]  # raw label -> validation message
    raw: int


def label(spec: CorrectionSpec) -> str:
    return json.dumps(spec.non_default(), sort_keys=True)


def classify(points: Iterator[dict[str, Any]] | None = None) -> Classified:
    """Validate, canonicalise and deduplicate the matrix, then ask the verl backend's check."""
    out = Classified({}, {}, {}, 0)
    seen: set[str] = set()
    for raw in matrix() if points is None else points:
        out.raw += 1
        try:
            spec = CorrectionSpec.model_validate(raw).canonical()
        except ValidationError as exc:
            out.invalid[json.dumps(raw, sort_keys=True)] = exc.errors()[0]["msg"]
            continue
        key = label(spec)
        if key in seen:
            continue
        seen.add(key)
        problem = mapping.check_correction(spec)
        if problem:
            out.refused[key] = (spec, problem)
        else:
            out.allowed[key] = spec
    return out


# --------------------------------------------------------------------------- inputs


@dataclasses.dataclass(frozen=True)
class Batch:
    name: str  # kind/dtype
    old: torch.Tensor  # pi_old (decoupled) or pi_theta (bypass) log-probs [B, R]
    mu: torch.Tensor  # rollout log-probs [B, R]
    mask: torch.Tensor  # response mask [B, R], same dtype


def make_batch(kind: str, dtype: torch.dtype, seed: int = 0) -> Batch:
    """A seeded batch: ragged lengths, multi-turn holes, all-masked rows, and per ``kind``:
    ``plain`` (moderate mismatch), ``extreme`` (log-ratios exactly +-20 and beyond) or
    ``nonfinite`` (NaN, -inf and +inf at masked positions of both log-prob tensors)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(R)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    mask = pos[None] < lengths[:, None]
    for row in HOLE_ROWS:  # a masked span strictly inside a long response (tool output)
        lengths[row] = R
        start = int(torch.randint(2, R // 2, (1,), generator=g))
        mask[row] = (pos < start) | (pos >= start + 3)
    for row in EMPTY_ROWS:
        mask[row] = False
    mu = -(torch.rand(B, R, generator=g) * 4 + 0.01)
    d = torch.randn(B, R, generator=g) * 0.35
    old = mu + d
    if kind == "extreme":
        # Values with few mantissa bits, so bf16 keeps the log-ratio exactly at +-20 too.
        big = torch.tensor([20.0, -20.0, 24.0, -30.0, 40.0, -64.0, 20.5, -21.0])
        rows = torch.randint(0, B, (14,), generator=g)
        cols = torch.randint(0, R, (14,), generator=g)
        for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
            v = float(big[i % len(big)])
            u = (0.25, 0.5, 1.0, 1.5)[i % 4]
            mu[r, c], old[r, c] = ((-(v + u), -u) if v > 0 else (-u, -(-v + u)))
    if kind == "nonfinite":
        fill = torch.tensor([float("nan"), float("-inf"), float("inf")])
        pick = torch.randint(0, 3, (B, R), generator=g)
        old = torch.where(mask, old, fill[pick])
        mu = torch.where(mask, mu, fill[(pick + 1) % 3])
    return Batch(f"{kind}/{str(dtype).removeprefix('torch.')}", old.to(dtype), mu.to(dtype),
                 mask.to(dtype))


KINDS = ("plain", "extreme", "nonfinite")


def batches(seed: int = 0) -> list[Batch]:
    """One batch per kind and dtype (fp32, bf16): each disagreement names its cause."""
    return [make_batch(k, dt, seed) for k in KINDS for dt in (torch.float32, torch.bfloat16)]


def mixed_batches(seed: int = 0) -> list[Batch]:
    """The rows of every kind in one batch per dtype (fp32, bf16): 72 rows, the same coverage
    in a third of the calls."""
    out = []
    for dt in (torch.float32, torch.bfloat16):
        parts = [make_batch(k, dt, seed + i) for i, k in enumerate(KINDS)]
        out.append(Batch(f"mixed/{str(dt).removeprefix('torch.')}",
                         *(torch.cat([getattr(p, f) for p in parts]) for f in ("old", "mu", "mask"))))
    return out


# --------------------------------------------------------------------------- the two sides


@dataclasses.dataclass
class Outcome:
    weights: torch.Tensor | None  # IS weights as computed (applied or metrics only)
    applied: bool  # whether the loss multiplies by them
    loss_mask: torch.Tensor
    denom_mask: torch.Tensor


def verl_side(spec: CorrectionSpec, settings: dict[str, Any], b: Batch,
              cache: dict[Any, Any]) -> Outcome:
    """What verl 0.9.1 computes for ``settings`` (see the module docstring for the trainer side)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    helper_keys = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize",
                   "rollout_rs", "rollout_rs_threshold")
    kw = {k: settings[k] for k in helper_keys}
    key = (b.name, tuple(kw.items()))
    if key not in cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                proto, mask, _ = compute_rollout_correction_and_rejection_mask(
                    old_log_prob=b.old, rollout_log_prob=b.mu, response_mask=b.mask, **kw)
                cache[key] = (None if proto is None else proto.batch["rollout_is_weights"], mask)
            except Exception as exc:  # noqa: BLE001 - a raise is a result here
                cache[key] = exc
    got = cache[key]
    if isinstance(got, Exception):
        raise got
    weights, mask = got
    bypass = settings["bypass_mode"]
    applied = weights is not None and not (bypass and settings["loss_type"] == "ppo_clip")
    return Outcome(weights, applied, mask, b.mask if bypass else mask)


def sim_side(spec: CorrectionSpec, b: Batch) -> Outcome:
    corr = correction_math.apply_correction(b.old, b.mu, b.mask, spec)
    weights = corr.weights
    if weights is None and spec.is_level != "none":  # computed for metrics only
        weights = correction_math.is_weights((b.old - b.mu).detach(), b.mask, spec)[0]
    return Outcome(weights, corr.weights is not None, corr.loss_mask, corr.denom_mask)


def _close(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> bool:
    a, b = a.double()[where], b.double()[where]
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return False
    return bool(((a - b).abs() <= RTOL * b.abs()).all())


def compare(spec: CorrectionSpec, b: Batch, cache: dict[Any, Any]) -> list[str]:
    """Names of what differs between the simulator and verl for ``spec`` on ``b`` ([] = parity)."""
    settings = mapping.correction_settings(spec)
    try:
        theirs = verl_side(spec, settings, b, cache)
    except Exception as exc:  # noqa: BLE001
        return [f"verl raises {type(exc).__name__}"]
    try:
        ours = sim_side(spec, b)
    except Exception as exc:  # noqa: BLE001
        return [f"sim raises {type(exc).__name__}"]
    valid = b.mask != 0
    diffs = []
    for name in ("loss_mask", "denom_mask"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        if not torch.isfinite(mine).all():
            diffs.append(f"{name} non-finite")
        elif not torch.equal(mine.double(), other.double()):
            diffs.append(name)
    if ours.applied != theirs.applied:
        diffs.append("weights applied")
    if (ours.weights is None) != (theirs.weights is None):
        diffs.append("weights computed")
    elif ours.weights is not None and theirs.weights is not None:
        if not torch.isfinite(ours.weights).all():
            diffs.append("weights non-finite")
        elif not _close(ours.weights, theirs.weights, valid):
            diffs.append("weights")
    return diffs


@dataclasses.dataclass
class Report:
    specs: int
    cases: int
    disagreements: list[tuple[str, str, list[str]]]  # (spec label, batch, what)

    def by(self, key: str) -> Counter[str]:
        """Disagreeing cases counted by batch, by object, or by spec feature."""
        c: Counter[str] = Counter()
        for spec, batch, what in self.disagreements:
            if key == "batch":
                c[batch] += 1
            elif key == "what":
                c.update(what)
            else:
                fields = json.loads(spec)
                c[f"{key}={fields.get(key, CorrectionSpec.model_fields[key].default)}"] += 1
        return c


def run(specs: dict[str, CorrectionSpec], inputs: list[Batch]) -> Report:
    cache: dict[Any, Any] = {}
    out = []
    for key, spec in specs.items():
        for b in inputs:
            what = compare(spec, b, cache)
            if what:
                out.append((key, b.name, what))
    return Report(len(specs), len(specs) * len(inputs), out)
