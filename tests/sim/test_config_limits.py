"""The simulator's plan-time limits: ranges with the key and the allowed values, the machine's
CPUs, and a memory estimate whose parameter count is the model's real one."""
from __future__ import annotations

import pytest

from orchestrator.exceptions import UserError
from orchestrator.pools import load_catalog
from orchestrator.sim.config import build_setup, machine_cpus, memory_estimate

POOL = load_catalog().get("sim-h100")


def _config(**sections: dict) -> dict:
    base = {"model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128},
            "task": {}, "train": {}, "eval": {}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


@pytest.mark.parametrize("model", [
    {"arch": "dense", "d_model": 48, "n_layers": 3, "n_heads": 4, "d_ff": 96},
    {"arch": "moe", "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "n_experts": 8,
     "top_k": 2, "expert_d_ff": 16},
    {"arch": "moe", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 24, "n_experts": 4,
     "top_k": 1, "expert_d_ff": None},
])
def test_parameter_estimate_is_the_real_count(model: dict) -> None:
    from orchestrator.sim.model import ModelConfig, init_params
    from orchestrator.sim.task import Task

    task = Task(vocab=40, digits=4, response_len=20)
    params, need = memory_estimate(model, {"vocab": 40, "digits": 4, "response_len": 20}, {})
    real = init_params(ModelConfig(vocab=task.vocab, max_len=task.seq_len, **model), seed=0)
    assert params == sum(t.numel() for t in real.values())
    assert need > params * 4 * 4  # at least weights, gradients and two Adam moments


@pytest.mark.parametrize("section, key, value, message", [
    ("model", "n_layers", 0, "model.n_layers: must be in 1..256, got 0"),
    ("model", "n_layers", -1, "model.n_layers: must be in 1..256, got -1"),
    ("model", "n_layers", 10**15, "model.n_layers: must be in 1..256"),
    ("model", "d_model", 0, "model.d_model: must be in 1..16384, got 0"),
    ("train", "lr", -1e-3, "train.lr: must be > 0, got -0.001"),
    ("train", "lr", 0, "train.lr: must be > 0, got 0"),
    ("train", "grad_clip", 0.0, "train.grad_clip: must be > 0"),
    ("train", "adam_beta2", 1.0, "train.adam_beta2: must be in 0..0.999999, got 1.0"),
    ("eval", "every", 0, "eval.every: must be >= 1, got 0"),
    ("eval", "prompts", 0, "eval.prompts: must be in 1..65536, got 0"),
    ("task", "vocab", 10, "task.vocab: must be in 24..65536, got 10"),
])
def test_values_that_cannot_run_are_refused(section: str, key: str, value: object,
                                            message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build_setup(_config(**{section: {key: value}}), POOL)


def test_threads_within_the_machine() -> None:
    cpus = machine_cpus()
    assert build_setup(_config(train={"threads": cpus}), POOL).threads == cpus
    with pytest.raises(UserError, match=f"train.threads: must be in 1..{cpus}"):
        build_setup(_config(train={"threads": cpus + 1}), POOL)


def test_model_that_cannot_fit_in_memory() -> None:
    big = {"d_model": 16384, "n_layers": 64, "n_heads": 16, "d_ff": 65536}
    with pytest.raises(UserError, match=r"model\.d_model: a model of ~.* parameters .* GiB to "
                                        r"train, more than this machine's"):
        build_setup(_config(model=big), POOL)
