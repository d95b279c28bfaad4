"""The trainer and launcher contracts: optional capabilities are explicit defaults, not looked
up by name; a grid's backend is its trainer(s) and launcher, and trial ids hash what they did."""
from __future__ import annotations

from orchestrator.backends import TrialConfig, backend
from orchestrator.pools import load_catalog
from orchestrator.trial import TrialSpec

TRIAL = TrialSpec(trial_id="t1", grid="g", backend="sim", recipe="sim/grpo_tiny", pool="sim-h100",
                  seed=0, steps=10, axes=(), overrides=(("correction.is_bounds", (0.5, 2.0)),
                                                        ("correction.is_level", "token")))


def test_describe_defaults_to_the_overrides_as_json() -> None:
    pool = load_catalog().get("sim-h100")
    assert backend("sim").trainer(pool).job(TrialConfig.of({}, pool)) is None  # runs in-process
    assert backend("sim").describe(TRIAL, TrialConfig.of({}, pool)) == [
        "correction.is_bounds=[0.5, 2.0]", 'correction.is_level="token"']


def test_a_value_the_trainer_takes_is_no_problem() -> None:
    config = TrialConfig.of({}, load_catalog().get("h100"))
    values = frozenset({"values"})
    assert not backend("k8s").problems(config, stages=values, given=[("trainer.total_epochs", 3)])
    found = backend("verl").problems(config, stages=values, given=[("x", "${oops}")])
    assert [p.stage for p in found] == ["values"] and found[0].reason.startswith("x: ")


def test_trial_ids_hash_what_they_hashed_before_trainers_and_launchers_were_apart() -> None:
    assert {name: backend(name).identity() for name in ("sim", "verl", "k8s", "slurm")} == {
        "sim": {"backend": "sim", "backend_version": "sim-2"},
        "verl": {"backend": "verl", "backend_version": "verl-0.9.1"},
        "k8s": {"backend": "verl", "backend_version": "verl-0.9.1"},  # the same verl job
        "slurm": {"backend": "slurm", "backend_version": "slurm-1+sim-2+verl-0.9.1"},
    }


def test_slurm_runs_the_trainer_of_each_pools_kind() -> None:
    from orchestrator.sim.job import SimTrainer
    from orchestrator.slurm.launcher import SlurmLauncher
    from orchestrator.verl.trainer import VerlTrainer

    catalog = load_catalog()
    slurm = backend("slurm")
    assert slurm.launcher is SlurmLauncher and slurm.computes_elsewhere
    assert slurm.pool_kinds == ("sim", "cpu", "gpu")
    assert slurm.trainer(catalog.get("sim-h100")) is SimTrainer
    assert slurm.trainer(catalog.get("cpu-fp32")) is VerlTrainer
    assert slurm.trainer(catalog.get("h100")) is VerlTrainer
    assert backend("verl").pool_kinds == ("gpu", "cpu") and backend("sim").pool_kinds == ("sim",)


def test_every_backend_a_grid_may_name_is_registered() -> None:
    import typing

    from orchestrator.backends import names
    from orchestrator.schema import GridFile

    assert set(names()) == set(typing.get_args(GridFile.model_fields["backend"].annotation))


def test_a_new_trainer_is_its_package_and_one_registry_line(monkeypatch) -> None:
    """The contract of issue 54: a trainer class (here the suite's double, which implements only
    ``run``) registered by one line is a backend of its name, launched here, whose every
    plan-time question has an answer: no problem but the learner vocabulary it does not map,
    the vocabulary as what it emits, no reference evaluator. (A grid file also names it in
    ``schema.BACKENDS``, the vocabulary below the registry; the test above holds them equal.)"""
    from orchestrator import backends
    from orchestrator.backends.local import LocalLauncher
    from orchestrator.learner import LearnerSpec

    monkeypatch.setitem(backends._TRAINERS, "double", ("doubles", "DoubleTrainer"))
    runs = backend("double")
    pool = load_catalog().get("sim-h100")
    assert "double" in backends.names() and runs.launcher is LocalLauncher
    assert runs.trainer(pool).__name__ == "DoubleTrainer"
    assert runs.identity() == {"backend": "double", "backend_version": "1"}
    config = TrialConfig.of({}, pool)
    assert runs.problems(config) == [] and runs.unemitted(config)
    fp16 = TrialConfig.of({"learner": LearnerSpec(precision="fp16").non_default()}, pool)
    (refused,) = runs.problems(fp16)
    assert refused.stage == "combination" and "does not map the learner vocabulary" in refused.reason
    assert runs.reported("actor/grad_norm", [pool]) and not runs.reported("no/such", [pool])
    assert "has no reference evaluator" in runs.evaluator(pool).problem("trainer", pool)
    assert runs.describe(TRIAL, config) == ['correction.is_bounds=[0.5, 2.0]',
                                            'correction.is_level="token"']
