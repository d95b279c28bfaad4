"""Metric names per backend: what each one really emits, verl's aliases, peer frameworks' names."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import metrics as M
from orchestrator.backends import backend
from orchestrator.exceptions import GridError
from orchestrator.grid import load_grid
from orchestrator.pools import PoolSpec, load_catalog
from orchestrator.verl.files import normalise


def _pool(kind: str) -> PoolSpec:
    catalog = load_catalog()
    return next(catalog.pools[n] for n in catalog.names() if catalog.pools[n].kind == kind)


def test_names_verl_never_emits_are_not_reported_for_verl_or_k8s() -> None:
    # A Slurm job on a gpu or cpu pool runs verl too: the same names.
    for backend_name, kind in (("verl", "gpu"), ("verl", "cpu"), ("k8s", "gpu"),
                               ("slurm", "gpu"), ("slurm", "cpu")):
        pools = [_pool(kind)]
        for name in (M.TV, M.VETO_FRACTION, M.OPSM_FRACTION, M.bucket_name(0.0, 1e-3)):
            assert not backend(backend_name).reported(name, pools), (name, backend_name)
        for name in (M.IS_OOB_RATIO, M.IS_MASKED_FRACTION, M.PROB_DIFF_MAX, M.PROB_DIFF_STD,
                     M.PROB_PEARSON, *M.rs_option_names("seq_mean_k1"), M.K3_KL,
                     "actor/some_new_metric"):
            assert backend(backend_name).reported(name, pools), (name, backend_name)


def test_the_simulator_reports_none_of_verls_own_names() -> None:
    for backend_name in ("sim", "slurm"):  # a Slurm job on a sim pool runs the simulator
        pools = [_pool("sim")]
        for name in (M.IS_OOB_RATIO, M.PROB_DIFF_STD, M.PROB_PEARSON,
                     *M.rs_option_names("token_k1")):
            assert not backend(backend_name).reported(name, pools)
        for name in (M.TV, M.VETO_FRACTION, M.IS_MASKED_FRACTION, M.bucket_name(0.1, 0.3)):
            assert backend(backend_name).reported(name, pools)


def test_verl_icepop_share_is_reported_under_the_shared_name_too() -> None:
    out = normalise({M.IS_OOB_RATIO: 0.125, "actor/rollout_corr/rollout_is_oob_ratio": 0.5})
    assert out[M.IS_OOB_RATIO] == 0.125 and out[M.IS_MASKED_FRACTION] == 0.125
    bypass = normalise({"actor/rollout_corr/rollout_is_oob_ratio": 0.5})  # bypass: actor prefix
    assert bypass[M.IS_MASKED_FRACTION] == 0.5


def test_peer_names_cover_known_vocabulary_names() -> None:
    assert set(M.PEER_NAMES) <= M.vocabulary()
    assert "train/train_rollout_kl" in M.PEER_NAMES[M.K3_KL][0]
    assert "train_rollout_kl" not in M.PEER_NAMES[M.K3_KL][1]  # slime has no train_rollout_kl


@pytest.mark.parametrize(("backend", "recipe", "pool", "metric"), [
    ("verl", "verl/qwen3_4b_dapo", "h100", "rollout_corr/tv"),
    ("k8s", "verl/qwen3_4b_dapo", "h100", "rollout_corr/rollout_veto_seq_fraction"),
    ("sim", "sim/grpo_tiny", "sim-h100", "training/rollout_actor_probs_pearson_corr"),
    # A Slurm job on a cpu pool runs verl, which never emits TV.
    ("slurm", "verl/cpu_tiny", "cpu-fp32", "rollout_corr/tv"),
])
def test_a_rule_on_a_name_the_backend_never_emits_is_refused(
        tmp_path: Path, backend: str, recipe: str, pool: str, metric: str) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(f"name: m\nbackend: {backend}\nrecipe: {recipe}\nsteps: 5\npool: {pool}\n"
                    "axes:\n  correction.is_level: [none]\ncollapse:\n  extra_rules:\n"
                    f"    - {{name: r, metric: {metric}, kind: above, threshold: 0.5}}\n")
    with pytest.raises(GridError, match="could never fire"):
        load_grid(grid)
    grid.write_text(grid.read_text().replace(metric, M.K3_KL))
    load_grid(grid)
