"""Every engine x flag x value of the ``rollout.*`` vocabulary against verl 0.9.1, on CPU.

For each combination the verl backend either refuses it at plan time (one line naming the
nearest setting) or builds the override list, which verl's Hydra compose accepts, whose config
dataclasses instantiate (``RolloutConfig`` for the chosen engine included), whose engine kwargs
pass what verl does to them before the engine sees them, and whose rollout-correction settings
dry-run in verl's helper (``verl.preflight.check_composed``). The composed value is read back
from verl's own config object and compared with the table's. What only a GPU shows (that the
engine applies the setting) is the provenance check of ``tests/verl/test_engine_gpu.py``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
from fakeengine import fake_engine

from orchestrator.engine import ENGINES, RolloutSpec
from orchestrator.grid import expand, load_grid
from orchestrator.pools import load_catalog
from orchestrator.verl import engines
from orchestrator.verl.trainer import VerlTrainer

REPO = Path(__file__).resolve().parents[2]
POOLS = load_catalog().pools
FLAGS = [f for f in RolloutSpec.model_fields if f not in ("engine", "provenance")]
SAMPLE = {"temperature": [0.7], "weight_lag": [0, 2], "max_num_seqs": [1, 256]}


def _values(flag: str) -> list[Any]:
    if flag in SAMPLE:
        return SAMPLE[flag]
    args = [a for a in get_args(RolloutSpec.model_fields[flag].annotation) if a is not type(None)]
    if args == [bool]:
        return [True, False]
    return [v for a in args for v in get_args(a)]


CASES = [(e, f, v) for e in ENGINES for f in FLAGS for v in _values(f)]


def test_every_flag_has_an_entry_in_every_engine_table() -> None:
    """A flag missing from a table would be silently dropped for that engine."""
    for engine, table in engines.TABLES.items():
        assert sorted(table) == sorted(FLAGS), engine
        for flag, entries in table.items():
            assert entries, (engine, flag)
            for entry in entries:
                text = entry.doc if isinstance(entry, engines.Key) else entry.why
                assert text and (not isinstance(entry, engines.Key) or entry.source)


def test_the_docs_table_names_every_key_of_every_engine_table() -> None:
    text = (REPO / "docs" / "engines.md").read_text()
    for table in engines.TABLES.values():
        for flag, entries in table.items():
            assert f"`rollout.{flag}" in text, flag
            for entry in entries:
                if isinstance(entry, engines.Key):
                    leaf = entry.key.rsplit(".", 1)[-1]
                    assert leaf in text, (flag, entry.key)


def test_refusals_name_the_nearest_setting() -> None:
    refused = [(e, f, v) for e, f, v in CASES
               if engines.check_engine(RolloutSpec(engine=e, **{f: v}), e)]
    assert ("sglang", "logprobs_mode", "raw") in refused
    assert ("sglang", "cudagraph_mode", "piecewise") in refused
    assert ("vllm", "attention_backend", "torch_native") in refused
    assert ("vllm", "deterministic", True) in refused and ("sglang", "deterministic", True) in refused
    assert ("vllm", "logprobs_mode", "raw") not in refused
    for e, f, v in refused:
        line = engines.check_engine(RolloutSpec(engine=e, **{f: v}), e)
        assert f"rollout.{f}" in line and "nearest:" in line and "\n" not in line


def test_cross_flag_refusals() -> None:
    check = engines.check_engine
    assert "hf_overrides" in check(RolloutSpec(engine="vllm", lm_head_fp32=True, dtype="fp8"), "vllm")
    assert check(RolloutSpec(engine="sglang", lm_head_fp32=True, dtype="fp8"), "sglang") is None
    assert "cudagraph_mode: none" in check(
        RolloutSpec(engine="vllm", enforce_eager=True, cudagraph_mode="full"), "vllm")
    assert "kv_cache_dtype" in check(RolloutSpec(kv_cache_dtype="fp16", dtype="bf16"), "sglang")
    assert "not a rollout engine" in check(RolloutSpec(), "hf")



def test_an_installed_engine_without_a_requested_feature_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_engine(tmp_path, "vllm", "0.18.0", {"config/model.py": "class ModelConfig: pass\n",
                                              "engine/arg_utils.py": "async_scheduling = None\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.invalidate_caches()
    refusal, warning = engines.check_installed(RolloutSpec(lm_head_fp32=True), "vllm")
    assert warning is None
    assert refusal.startswith("rollout.lm_head_fp32: the installed vllm 0.18.0 has no")
    assert "pip install -U vllm" in refusal
    assert engines.check_installed(RolloutSpec(async_scheduling=False), "vllm") == (None, None)


def test_a_missing_engine_package_warns_and_planning_goes_on(tmp_path: Path) -> None:
    from cliproc import ablate_env, run

    grid = tmp_path / "g.yaml"
    grid.write_text("name: eng\nbackend: verl\nrecipe: verl/qwen3_4b_dapo\nsteps: 2\npool: h100\n"
                    "axes:\n  rollout.engine: [sglang, vllm]\n  rollout.prefix_caching: [false]\n")
    with ablate_env(tmp_path) as env:
        out = run(["plan", str(grid)], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2 trials" in out.stdout
    if engines.installed("vllm") is None:
        assert "warning: vllm is not installed on this machine" in out.stderr
    grid.write_text(grid.read_text() + "  rollout.cudagraph_mode: [piecewise]\n")
    with ablate_env(tmp_path) as env:
        bad = run(["plan", str(grid)], env, tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    line = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "rollout.cudagraph_mode: piecewise cannot be expressed on sglang" \
        in line[0] and "nearest: rollout.enforce_eager" in line[0]


# --------------------------------------------------------------------------- verl's config

pytest.importorskip("verl")


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any, dict[str, Any]]:
    grid = load_grid(REPO / "grids" / "seed000_vllm.yaml")
    trial = expand(grid)[0]
    return grid, trial, grid.trial_config(trial)


def _expected(engine: str, flag: str, value: Any) -> list[tuple[str, Any]]:
    """(dotted key without '+', value verl's config must hold) from the engine's table."""
    out = []
    for entry in engines.TABLES[engine][flag]:
        if isinstance(entry, engines.Key):
            emit, verl_value = entry.value_for(value)
            if emit:
                out.append((entry.key.lstrip("+"), verl_value))
    return out


def _get(cfg: Any, dotted: str) -> Any:
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, dotted, throw_on_missing=True)
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node


@pytest.mark.slow  # ~65 composes, ~35 s on 2 cores
def test_every_engine_flag_value_composes_instantiates_and_dry_runs(base: Any) -> None:
    from orchestrator.verl.preflight import check_composed, compose, verl_config_dir

    _grid, trial, config = base
    # A pool whose images declare engines that apply every flag (vLLM 0.32: head_dtype reaches
    # the LM head; SGLang 0.5.11: fa3 still captures CUDA graphs), so the version checks of
    # tests/verl/test_engine_versions.py refuse none of the compose cases.
    pool = POOLS[trial.pool].model_copy(
        update={"engine_versions": {"vllm": "0.32.0", "sglang": "0.5.11"}})
    composed = 0
    with verl_config_dir():
        for engine, flag, value in CASES:
            rollout = RolloutSpec(engine=engine, **{flag: value})
            cfg_in = config.updated({"rollout": rollout.non_default()}, pool=pool)
            if VerlTrainer.problems(cfg_in.updated({"correction": _correction().non_default()}),
                                    stages=frozenset({"combination", "engine"})):
                continue
            items = VerlTrainer.overrides(trial, cfg_in)
            cfg = compose(items)
            built = check_composed(cfg, label=f"{engine}/{flag}={value}")
            assert built["rollout"].name == engine
            for key, want in _expected(engine, flag, value):
                assert _get(cfg, key) == want, (engine, flag, value, key)
            if engine == "vllm" and flag == "cudagraph_mode":
                kwargs = built["rollout"].engine_kwargs["vllm"]
                assert json.loads(kwargs["compilation_config"]) == {"cudagraph_mode": value.upper()}
            composed += 1
    assert composed >= 60, composed
    print(f"\ncomposed and instantiated {composed} engine x flag x value combinations")


def test_a_bad_engine_kwarg_value_fails_in_the_preflight(base: Any) -> None:
    from orchestrator.exceptions import GridError
    from orchestrator.verl.preflight import preflight

    _grid, trial, config = base
    pool = POOLS[trial.pool]
    items = VerlTrainer.overrides(trial, config.updated({"rollout": {"engine": "vllm"}}, pool=pool))
    bad = items + [("+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config="
                    "'{\"cudagraph_mode\": \"SOMETIMES\"}'")]
    with pytest.raises(GridError, match="SOMETIMES"):
        preflight([bad])
    with pytest.raises(GridError, match="rejects the overrides"):
        preflight([items + ["actor_rollout_ref.rollout.enable_chunked_prefil=false"]])


def _correction() -> Any:
    from orchestrator.corrections import CorrectionSpec

    return CorrectionSpec()


def test_plan_refuses_a_flag_the_installed_vllm_lacks_in_one_line(tmp_path: Path) -> None:
    from cliproc import ablate_env, run

    site = tmp_path / "site"
    fake_engine(site, "vllm", "0.18.0", {"config/model.py": "class ModelConfig: pass\n"})
    grid = tmp_path / "g.yaml"
    grid.write_text("name: eng\nbackend: verl\nrecipe: verl/qwen3_4b_dapo\nsteps: 2\npool: h100\n"
                    "axes:\n  rollout.engine: [vllm]\n  rollout.lm_head_fp32: [true]\n")
    with ablate_env(tmp_path) as env:
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{site}"
        out = run(["plan", str(grid)], env, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    # vLLM < 0.32 ignores head_dtype for a generative model (issue 36): refused by version.
    assert "rollout.lm_head_fp32: vllm 0.18.0 (installed here) ignores it" in line
    assert "vllm >= 0.32.0" in line
    assert not (tmp_path / ".ablate").exists()  # nothing started, nothing written


def test_ablate_env_lists_the_engines_installed_here(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import environment

    site = tmp_path / "site"
    fake_engine(site, "vllm", "0.33.0", {})
    monkeypatch.syspath_prepend(str(site))
    import importlib

    importlib.invalidate_caches()
    info = environment.collect()
    assert info["engine.vllm"] == "0.33.0"
    assert info["engines_installed"].split(", ")[:2] == ["cpu", "vllm"]
    assert "engine.sglang" in info
