"""The backend interface: optional capabilities are explicit defaults, not looked up by name."""
from __future__ import annotations

from orchestrator.backends import backend_class
from orchestrator.pools import load_catalog
from orchestrator.trial import TrialSpec

TRIAL = TrialSpec(trial_id="t1", grid="g", backend="sim", recipe="sim/grpo_tiny", pool="sim-h100",
                  seed=0, steps=10, axes=(), overrides=(("correction.is_bounds", (0.5, 2.0)),
                                                        ("correction.is_level", "token")))


def test_describe_defaults_to_the_overrides_as_json() -> None:
    pool = load_catalog().get("sim-h100")
    assert "describe" not in vars(backend_class("sim"))  # the interface's default
    assert backend_class("sim").describe(TRIAL, {}, pool) == [
        "correction.is_bounds=[0.5, 2.0]", 'correction.is_level="token"']


def test_check_values_defaults_to_no_refusal() -> None:
    pool = load_catalog().get("h100")
    assert backend_class("k8s").check_values([("trainer.total_epochs", 3)], {}, pool) is None
    assert backend_class("verl").check_values([("x", "${oops}")], {}, pool)  # verl's own check
