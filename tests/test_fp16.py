"""fp16 learners (issue 36 item 1): a skipped update is not a numeric failure.

verl 0.9.1's fp16 path (``workers/engine/fsdp/transformer_impl.py``) builds
``ShardedGradScaler(growth_interval=400)``, unscales, clips and lets ``scaler.step`` skip the
update on overflow, returning (and logging as ``actor/grad_norm``) the non-finite norm. The
project logs its own ``fp16/skipped_share``; the verdict excuses the grad norm of a skipped step
and judges persistent skips by ``fp16_skipped_updates``. The facts are read from the installed
verl, so an upgrade that changes them fails here.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import verdict_streams as V
import verl

from orchestrator import metrics as M
from orchestrator.schema import CollapseSpec
from orchestrator.verdict import VerdictKind, judge

VERL = Path(verl.__file__).parent
IMPL = VERL / "workers/engine/fsdp/transformer_impl.py"


def _lines(path: Path, pattern: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if re.search(pattern, line)]


def test_verl_fp16_path_is_what_the_docs_cite() -> None:
    assert _lines(IMPL, r"ShardedGradScaler\(growth_interval=400\)") == [409]
    assert _lines(IMPL, r"scaler\.unscale_\(self\.optimizer\)") == [803]
    assert _lines(IMPL, r"scaler\.step\(self\.optimizer\)") == [819]
    assert _lines(IMPL, r"return grad_norm\.item\(\)") == [834]  # the non-finite norm included


def test_verl_logs_no_loss_scale_or_skip_metric() -> None:
    """The project's names are its own (metrics.py): verl 0.9.1 has neither."""
    text = "\n".join(p.read_text(errors="replace") for p in VERL.rglob("*.py"))
    assert "skipped_update" not in text and "skipped_share" not in text
    assert not re.search(r"[\"'][\w/]*/loss_scale[\"']", text)
    assert M.SKIPPED_SHARE.startswith("fp16/") and M.LOSS_SCALE.startswith("fp16/")
    assert not M.reported(M.LOSS_SCALE, "verl") and M.reported(M.LOSS_SCALE, "sim")


def _fp16(stream, skips: set[int]):
    """``stream`` as an fp16 learner logs it: on the steps in ``skips`` every update overflowed
    (grad norm inf, skipped share 1), elsewhere skipped share 0."""
    out = []
    for step, row in stream:
        row = dict(row)
        row[M.SKIPPED_SHARE] = 1.0 if step in skips else 0.0
        if step in skips:
            row[M.GRAD_NORM] = math.inf if step % 2 else math.nan
        out.append((step, row))
    return out


def test_routine_overflow_skips_are_not_a_numeric_failure() -> None:
    # the start (the scale halves 5 times) and a growth every 400 steps would be 1 skip each;
    # here bursts of up to 9 steps, below the rule's patience
    skips = {1, 2, 3, 4, 5, 60, 140, 141, 200, *range(230, 239)}
    v = judge(_fp16(V.healthy(seed=0), skips), CollapseSpec())
    assert v.kind is VerdictKind.HEALTHY, v.reason


def test_persistent_skips_are_judged_by_their_own_rule() -> None:
    v = judge(_fp16(V.healthy(seed=0), set(range(150, 301))), CollapseSpec())
    assert v.kind is VerdictKind.COLLAPSED and v.rule == "fp16_skipped_updates" and v.step == 150
    assert "fp16 loss scaler skipped" in v.reason


def test_skips_that_stop_leave_the_trial_unstable_not_collapsed() -> None:
    v = judge(_fp16(V.healthy(seed=0), set(range(150, 170))), CollapseSpec())
    assert v.kind is VerdictKind.UNSTABLE and v.rule == "fp16_skipped_updates"


def test_a_nonfinite_grad_norm_without_a_skip_is_still_a_numeric_failure() -> None:
    rows = _fp16(V.healthy(seed=0), set())
    rows[59][1][M.GRAD_NORM] = math.inf  # bf16/fp32, or fp16 with no update skipped
    v = judge(rows, CollapseSpec())
    assert v.kind is VerdictKind.NUMERIC_FAILURE and v.step == rows[59][0]
    rows = _fp16(V.healthy(seed=0), {60})
    rows[59][1][M.PG_LOSS] = math.nan  # only the grad norm is excused on a skipped step
    assert judge(rows, CollapseSpec()).kind is VerdictKind.NUMERIC_FAILURE
