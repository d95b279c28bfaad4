"""The verl probe's token-level figures (``probe/verl_tokens.py``) against verl 0.9.1's own code:
the function it wraps exists where it says and still returns verl's metrics unchanged, and each
call writes the simulator probe's figures of the very tensors verl computed its k3 from. No verl
job: verl's ``rollout_corr_helper`` is called here on a small batch."""
from __future__ import annotations

import importlib
import json

import pytest

torch = pytest.importorskip("torch")
helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")

from orchestrator.probe import verl_tokens
from orchestrator.sim.probe import batch_stats


@pytest.fixture
def wrapped(monkeypatch, tmp_path):
    module = importlib.reload(helper)  # unwrapped, whatever ran before
    original = module.compute_offpolicy_metrics
    verl_tokens.patch(module)
    monkeypatch.setenv(verl_tokens.LOG_ENV, str(tmp_path / "tokens.jsonl"))
    yield module, original, tmp_path / "tokens.jsonl"
    importlib.reload(helper)


def _batch() -> tuple:
    gen = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(4, 6, 32, generator=gen), -1)[..., 0]
    rollout = old.clone()
    rollout[:, ::2] += 1e-3 * torch.randn(4, 3, generator=gen)  # half the tokens differ
    mask = torch.ones(4, 6)
    mask[0, 4:] = 0
    return old, rollout, mask


def test_the_hook_writes_the_probe_figures_of_verls_own_tensors(wrapped) -> None:
    module, original, log = wrapped
    old, rollout, mask = _batch()
    got = module.compute_offpolicy_metrics(old_log_prob=old, rollout_log_prob=rollout,
                                           response_mask=mask)
    assert got == original(old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    want = batch_stats(old, rollout, mask)
    assert {k: v for k, v in line.items() if k != "pid"} == {
        k: want[k] for k in verl_tokens.KEYS if k in want}
    assert line["tokens"] == 22 and 0.4 < line["bitwise_share"] < 0.6
    # verl's k3 (float32, as the log-probs) and the buckets' (float64) agree on the same tokens
    # to verl's rounding
    bucket_k3 = sum(line[f"mismatch/k3_kl/p_{b}"] * line[f"mismatch/token_fraction/p_{b}"]
                    for b in ("0-0.001", "0.001-0.01", "0.01-0.1", "0.1-0.3", "0.3-0.5",
                              "0.5-0.7", "0.7-0.9", "0.9-0.99", "0.99-1")
                    if f"mismatch/k3_kl/p_{b}" in line)
    assert bucket_k3 == pytest.approx(got["k3_kl"], rel=2e-2)


def test_the_driver_path_calls_the_wrapped_function_once_per_batch(wrapped) -> None:
    """verl's decoupled-mode entry (``compute_rollout_correction_and_rejection_mask``, what
    ``compute_rollout_correction_and_add_to_batch`` calls in the driver) reaches the wrapper."""
    module, _, log = wrapped
    old, rollout, mask = _batch()
    module.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)
    assert len(log.read_text().splitlines()) == 1


def test_without_the_variable_nothing_is_written(wrapped, monkeypatch) -> None:
    module, _, log = wrapped
    monkeypatch.delenv(verl_tokens.LOG_ENV)
    module.compute_offpolicy_metrics(*_batch())
    assert not log.exists()
