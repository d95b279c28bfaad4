"""The rollout server without Ray: generation output and weight sync."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")

from orchestrator.verl.cpu import assets
from orchestrator.verl.cpu.rollout.server import CpuRolloutServer


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> assets.Assets:
    return assets.build(assets.AssetSpec(n_train=8, n_val=4),
                        cache_root=tmp_path_factory.mktemp("assets"))


def _server(built: assets.Assets, dtype: str, **extra: object) -> CpuRolloutServer:
    from omegaconf import OmegaConf

    config = SimpleNamespace(dtype=dtype, seed=0, max_model_len=None, response_length=6,
                             prompt_length=8, ignore_eos=False, **extra)
    model_config = OmegaConf.create({"path": str(built.model_dir),
                                     "override_config": {"attn_implementation": "sdpa"}})
    return CpuRolloutServer(config=config, model_config=model_config, replica_rank=0)


def test_generate_returns_token_output(built, monkeypatch, tmp_path: Path):
    server = _server(built, "bfloat16")
    assert next(server.model.parameters()).dtype == torch.bfloat16
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
              "logprobs": True}
    out = asyncio.run(server.generate(prompt_ids=[9, 13, 5], sampling_params=dict(params),
                                      request_id="r1"))
    assert 1 <= len(out.token_ids) <= 6 and len(out.log_probs) == len(out.token_ids)
    assert all(lp <= 0 for lp in out.log_probs) and out.stop_reason == "completed"
    assert out.extra_fields["finish_reason"] in ("stop", "length")


def test_update_weights_changes_served_model(built, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("ABLATE_CPU_ROLLOUT_SYNC_LOG", str(tmp_path / "sync.jsonl"))
    server = _server(built, "float32")
    before = asyncio.run(server.weight_fingerprint())
    state = {k: v.detach().clone() + 0.01 for k, v in server.model.named_parameters()}
    record = asyncio.run(server.update_weights(state, global_steps=3))
    assert record["n_tensors"] == len(state) and record["max_abs_change"] == pytest.approx(0.01, rel=1e-3)
    assert record["fingerprint"] != before and server.global_steps == 3
    assert (tmp_path / "sync.jsonl").read_text().count("\n") == 1
    state.pop(next(iter(state)))
    with pytest.raises(KeyError):
        asyncio.run(server.update_weights(state, global_steps=4))


@pytest.mark.parametrize(("dtype", "shown"), [("float32", "float32"), ("bfloat16", "bfloat16")])
def test_the_cpu_engine_reports_what_it_loaded(built, monkeypatch, tmp_path: Path, dtype: str,
                                               shown: str) -> None:
    """Provenance of the CPU engine: the dtype of the loaded weights, not the requested one."""
    from orchestrator.engine import RolloutSpec
    from orchestrator.verl import provenance as P

    log = tmp_path / "engine.jsonl"
    monkeypatch.setenv(P.LOG_ENV, str(log))
    _server(built, dtype)
    (report,) = P.read_reports(log)
    assert report.name == "cpu" and report.version.startswith("rl-ablate-")
    assert report.settings["dtype"] == shown and report.settings["attention_backend"] == "sdpa"
    asked = RolloutSpec(dtype="fp32")
    prov = P.compare(asked, [report], table_engine="sglang", engine="cpu")
    assert prov.unapplied == ([] if shown == "float32" else
                              ["rollout.dtype (asked dtype=float32, engine ran bfloat16)"])


def test_per_sample_seed_draws_a_reproducible_set_of_distinct_samples(built, monkeypatch,
                                                                      tmp_path: Path):
    """learner.preset true_on_policy: request k for a prompt draws with seed + k, so the n
    samples of a prompt differ and another server (or arrival order) draws the same set."""
    monkeypatch.setenv("ABLATE_CPU_ROLLOUT_SYNC_LOG", str(tmp_path / "sync.jsonl"))
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    def samples(server: CpuRolloutServer, prompts: list[list[int]]) -> list[tuple[int, ...]]:
        return [tuple(asyncio.run(server.generate(prompt_ids=p, sampling_params=dict(params),
                                                  request_id=str(i))).token_ids)
                for i, p in enumerate(prompts)]

    def seeded() -> CpuRolloutServer:
        return _server(built, "float32", engine_kwargs={"cpu": {"per_sample_seed": True}})

    a, b = seeded(), seeded()
    assert a.per_sample_seed
    first = samples(a, [[9, 13, 5]] * 4 + [[7, 8]] * 4)
    second = samples(b, [[7, 8]] * 4 + [[9, 13, 5]] * 4)  # another arrival order
    assert sorted(first) == sorted(second)
    assert len(set(first[:4])) > 1 and len(set(first[4:])) > 1
    state = {k: v.detach().clone() for k, v in a.model.named_parameters()}
    record = asyncio.run(a.update_weights(state, global_steps=1))
    assert record["per_sample_seed"] and record["prompt_groups_since_last_sync"] == 2
    assert record["clone_groups_since_last_sync"] == 0
