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
    from orchestrator.sim.job import SimTrainer
    from orchestrator.verl.trainer import VerlTrainer

    verl, sim = VerlTrainer.emits(), SimTrainer.emits()
    assert not verl.reports(M.LOSS_SCALE) and sim.reports(M.LOSS_SCALE)
    assert verl.reports(M.SKIPPED_SHARE) and sim.reports(M.SKIPPED_SHARE)


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


def test_verl_tail_derives_the_skipped_share_on_an_fp16_learner(tmp_path) -> None:
    """verl logs no skip flag: on an fp16 learner the metric tail reads a non-finite grad norm
    as a skipped step, and the stream it hands on is judged like the simulator's."""
    import json

    from orchestrator.verl.files import MetricTail, loss_scaled, normalise

    assert loss_scaled({"learner": {"precision": "fp16"}})
    assert not loss_scaled({"learner": {"precision": "bf16"}}) and not loss_scaled({})
    assert normalise({M.GRAD_NORM: math.inf}, loss_scaled=True)[M.SKIPPED_SHARE] == 1.0
    assert normalise({M.GRAD_NORM: 0.7}, loss_scaled=True)[M.SKIPPED_SHARE] == 0.0
    assert M.SKIPPED_SHARE not in normalise({M.GRAD_NORM: math.inf})  # bf16: a real failure
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "data": {M.GRAD_NORM: "NaN" if s <= 3 else 0.5, M.TRAIN_REWARD: 0.5}}
            for s in range(1, 30)]
    path.write_text("".join(json.dumps(r).replace('"NaN"', "NaN") + "\n" for r in rows))
    fp16 = MetricTail(path, 0, loss_scaled=True).poll()
    assert [row[M.SKIPPED_SHARE] for _, row in fp16[:5]] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert judge(fp16, CollapseSpec()).kind is not VerdictKind.NUMERIC_FAILURE
    bf16 = MetricTail(path, 0).poll()
    assert judge(bf16, CollapseSpec()).kind is VerdictKind.NUMERIC_FAILURE


def test_compare_reports_each_trials_skipped_share() -> None:
    from orchestrator.compare._data import TrialResult
    from orchestrator.compare._stats import cell_stats, format_cell
    from orchestrator.store import summary

    assert M.SKIPPED_SHARE in summary.CURVE_METRICS

    def trial(tid: str, shares: list[float] | None) -> TrialResult:
        curves = {M.TRAIN_REWARD: [(s, 0.5) for s in range(1, 5)]}
        if shares is not None:
            curves[M.SKIPPED_SHARE] = list(enumerate(shares, 1))
        return TrialResult(tid, "run", {}, 0, "sim-a100", "done", "healthy", None, "", None,
                           curves, {}, [])

    fp16 = [trial("a", [1.0, 0.5, 0.0, 0.0]), trial("b", [0.0, 0.0, 0.0, 0.5])]
    assert fp16[0].skipped_share == 0.375 and fp16[1].skipped_share == 0.125
    stats = cell_stats(fp16)
    assert stats["skipped_share"] == 0.25 and "skipped 25.0%" in format_cell(stats)
    bf16 = cell_stats([trial("c", None)])
    assert math.isnan(bf16["skipped_share"]) and "skipped" not in format_cell(bf16)


def test_the_simulators_loss_scaler_is_verls() -> None:
    """The simulator's fp16 path scales as verl's: the growth interval verl passes, torch's
    ShardedGradScaler defaults for the rest (initial scale, halving, doubling)."""
    import inspect

    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from orchestrator.sim.precision import LossScaler

    (line,) = [ln for ln in IMPL.read_text().splitlines() if "ShardedGradScaler(" in ln]
    interval = int(re.search(r"growth_interval=(\d+)", line).group(1))  # type: ignore[union-attr]
    torch_defaults = {k: p.default for k, p in inspect.signature(ShardedGradScaler).parameters.items()}
    scaler = LossScaler()
    assert (scaler.scale, scaler.growth_interval) == (torch_defaults["init_scale"], interval)
    assert (torch_defaults["backoff_factor"], torch_defaults["growth_factor"]) == (0.5, 2.0)
    scaler.update(False)
    assert scaler.scale == torch_defaults["init_scale"] * 0.5
    for _ in range(interval):
        scaler.update(True)
    assert scaler.scale == torch_defaults["init_scale"]


def test_the_docs_name_no_metric_verl_does_not_emit() -> None:
    """docs/ once said verl logs actor/loss_scale and actor/skipped_update; it has neither."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    for page in docs.rglob("*.md"):
        text = page.read_text()
        assert "actor/loss_scale" not in text and "actor/skipped_update" not in text, page
    learner = (docs / "learner.md").read_text()
    assert re.search(r"\| `fp16/loss_scale` \|[^\n]*\| the simulator only \|", learner)
