"""Issue 36 items 3-6: engine features checked against the version a trial really runs, start-up
failures refused at plan, per-configuration metrics, extras and docs; each fact read from verl
0.9.1's installed source or metadata where it lives there."""
from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
import tomllib
from doubles import config_of
from fakeengine import fake_engine

from orchestrator import metrics as M
from orchestrator.backends import backend
from orchestrator.corrections import CorrectionSpec
from orchestrator.engine import RolloutSpec
from orchestrator.learner import LearnerSpec
from orchestrator.pools import PoolSpec, load_catalog
from orchestrator.verl import engine_versions, engines

REPO = Path(__file__).resolve().parents[2]
POOLS = load_catalog().pools
verl = pytest.importorskip("verl")
VERL = Path(verl.__file__).parent


def _pin(pkg: str, extra: str) -> str:
    for req in importlib.metadata.requires("verl") or []:
        m = re.match(rf"{pkg}==([^;]+);.*extra == \"{extra}\"", req)
        if m:
            return m.group(1).strip()
    raise AssertionError(f"verl pins no {pkg} for extra {extra}")


def _gpu(**kw: object) -> PoolSpec:
    return POOLS["h100"].model_copy(update=kw)



# --------------------------------------------------------------------------- versions


def test_the_version_a_trial_runs_is_verls_pin_unless_the_pool_declares_one() -> None:
    assert engine_versions.pinned("vllm") == _pin("vllm", "vllm")
    assert engine_versions.pinned("sglang") == _pin("sglang", "sglang")
    if engines.installed("vllm") is None:
        assert engine_versions.engine_version("vllm", POOLS["h100"]) == (_pin("vllm", "vllm"),
                                                                 "verl[vllm]==0.9.1's pin")
    pool = _gpu(engine_versions={"vllm": "0.32.0"})
    assert engine_versions.engine_version("vllm", pool)[0] == "0.32.0"
    assert pool.identity()["engine_versions"] == {"vllm": "0.32.0"}
    assert "engine_versions" not in POOLS["h100"].identity()  # unset: trial ids unchanged
    with pytest.raises(ValueError, match="not a release version"):
        PoolSpec.model_validate({**POOLS["h100"].model_dump(), "engine_versions": {"vllm": "x y"}})


def test_lm_head_fp32_on_verls_pinned_vllm_is_refused_and_allowed_where_the_pool_declares_032(
        ) -> None:
    flags = RolloutSpec(engine="vllm", lm_head_fp32=True)
    pool_024 = _gpu(engine_versions={"vllm": _pin("vllm", "vllm")})
    problem = engine_versions.check_version(flags, "vllm", pool_024)
    assert problem and "ignores it" in problem and "; fix: " in problem
    assert engine_versions.check_version(flags, "vllm", _gpu(engine_versions={"vllm": "0.32.0"})) is None
    assert engine_versions.check_version(RolloutSpec(engine="sglang", lm_head_fp32=True), "sglang",
                                 POOLS["h100"]) is None


def test_fa3_on_sglang_from_0512_is_refused_as_verls_own_server_avoids_it() -> None:
    text = (VERL / "workers/rollout/sglang_rollout/async_sglang_server.py").read_text()
    assert f'version.parse("{engine_versions.SGLANG_NO_FA3}")' in text
    assert "FA3 CUDA-graph capture is broken" in text
    fa3 = RolloutSpec(engine="sglang", attention_backend="fa3")
    assert "FA3 CUDA-graph capture" in engine_versions.check_version(fa3, "sglang", POOLS["h100"])
    assert engine_versions.check_version(fa3, "sglang", _gpu(engine_versions={"sglang": "0.5.11"})) is None


def test_sglangs_seed_42_fact_is_cited_where_verl_and_sglang_have_it() -> None:
    """verl 0.9.1 sends SGLang no per-request seed; SGLang's deterministic mode then samples
    every request with seed 42 (read in sglang's own source where sglang is installed)."""
    lines = (VERL / "experimental/agent_loop/agent_loop.py").read_text().splitlines()
    first, last = (int(n) for n in engines.VERL_NO_SEED.rsplit(":", 1)[1].split("-"))
    built = "\n".join(lines[first - 1:last])
    assert built.strip().startswith("sampling_params = dict(") and built.strip().endswith(")")
    assert "seed" not in built
    assert not [p for p in VERL.rglob("*.py") if "sampling_seed" in p.read_text()]
    problem = engines.check_engine(RolloutSpec(engine="sglang", deterministic=True), "sglang")
    assert problem and engines.SGLANG_SEED_42 in problem and engines.VERL_NO_SEED in problem
    if engines.installed("sglang") != _pin("sglang", "sglang"):
        pytest.skip("sglang at verl's pin not installed here: its side is read on the GPU image")
    sglang_dir = Path(importlib.util.find_spec("sglang").origin).parent  # type: ignore[union-attr]
    path, span = engines.SGLANG_SEED_42.rsplit(":", 1)
    first, last = (int(n) for n in span.split("-"))
    text = "\n".join((sglang_dir / path).read_text().splitlines()[first - 1:last])
    assert re.search(r"sampling_seed\s+if r\.sampling_params\.sampling_seed is not None\s+"
                     r"else 42[\s\S]*if enable_deterministic", text), text


def test_fp32_with_half_only_attention_is_refused() -> None:
    for engine, backend_ in (("vllm", "fa3"), ("vllm", "flashinfer"), ("sglang", "flashinfer")):
        problem = engine_versions.check_version(RolloutSpec(dtype="fp32", attention_backend=backend_),
                                        engine, POOLS["h100"])
        assert problem and "fp16/bf16 only" in problem, (engine, backend_)
    assert engine_versions.check_version(RolloutSpec(dtype="fp32", attention_backend="triton"), "sglang",
                                 POOLS["h100"]) is None
    # verl's SGLang default from 0.5.12 is flashinfer (async_sglang_server.py:295)
    assert "default attention backend" in engine_versions.check_version(RolloutSpec(dtype="fp32"),
                                                                "sglang", POOLS["h100"])


def test_an_installed_vllm_is_checked_where_head_dtype_is_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.24.0's config/model.py has head_dtype (pooling models); its logits processor not.
    fake_engine(tmp_path, "vllm", "0.24.0", {
        "config/model.py": "head_dtype = None  # pooling models only\n",
        "model_executor/layers/logits_processor.py": "class LogitsProcessor: pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    refusal, _ = engines.check_installed(RolloutSpec(lm_head_fp32=True), "vllm")
    assert refusal and "logits_processor.py" in refusal


def test_the_sglang_install_check_finds_server_args_where_later_releases_moved_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_engine(tmp_path, "sglang", "0.6.0", {"srt/server_args/__init__.py": "",
                                         "srt/server_args/args.py": "enable_fp32_lm_head = False\n"
                                         "disable_overlap_schedule = False\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    flags = RolloutSpec(lm_head_fp32=True, async_scheduling=False)
    assert engines.check_installed(flags, "sglang") == (None, None)


def test_max_staleness_needs_cupy_which_the_gpu_extras_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = (VERL / "checkpoint_engine/nccl_checkpoint_engine.py").read_text()
    assert "import cupy" in text
    assert _pin("cupy-cuda13x", "cupy-cu130")  # the extra name verl's metadata gives
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name in ("gpu", "gpu-vllm"):
        (req,) = extras[name]
        assert "cupy-cu130" in req and req.endswith("==0.9.1"), req
    assert extras["gpu-vllm"] == ["verl[vllm,cupy-cu130]==0.9.1"]
    monkeypatch.setattr(engines, "installed", lambda e: "0.24.0")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "cupy" else real(n, *a))
    problem = engine_versions.checkpoint_engine_problem(LearnerSpec(max_staleness=2), POOLS["h100"])
    assert problem and "cupy" in problem and "ablate gpu-env" in problem
    assert engine_versions.checkpoint_engine_problem(LearnerSpec(), POOLS["h100"]) is None



def test_plan_refuses_max_staleness_without_cupy_in_one_line(
        isolated: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Where this machine runs the engine (one installed here) and lacks cupy; elsewhere the
    pool's image, built from the extras that install it, is not this machine's to check."""
    from orchestrator.cli import main

    monkeypatch.setattr(engines, "installed", lambda e: "0.5.12" if e == "sglang" else None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "cupy" else real(n, *a))
    grid = isolated / "g.yaml"
    grid.write_text("name: g\nrecipe: verl/qwen3_4b_dapo\nbackend: k8s\nsteps: 4\npool: h100\n"
                    "overrides:\n  learner.max_staleness: 2\n")
    assert main(["plan", str(grid)]) == 2
    out, err = capsys.readouterr()
    (line,) = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
    assert line.startswith(f"error: {grid}") and "cupy" in line and "fix" in line, err
    assert out == "" and not (isolated / ".ablate").exists()


# --------------------------------------------------------------------------- metrics


def test_verl_metrics_depend_on_the_configuration_as_in_verls_source() -> None:
    helper = (VERL / "trainer/ppo/rollout_corr_helper.py").read_text()
    assert "use_icepop = rollout_is_threshold_lower is not None" in helper
    assert re.search(r"if use_icepop:[\s\S]{0,300}rollout_is_oob_ratio", helper)
    assert re.search(r"if rollout_is_batch_normalize:[\s\S]{0,2500}rollout_is_batch_norm_factor",
                     helper)
    trainer = (VERL / "trainer/ppo/ray_trainer.py").read_text()
    # Validation during training only with test_freq > 0, at the line the docstring cites.
    line = trainer.splitlines()[1726]
    assert line.strip().startswith("if self.config.trainer.test_freq > 0 and ("), line
    assert re.search(r"if bypass_recomputing_logprobs:[\s\S]{0,2500}else:[\s\S]{0,3000}"
                     r"calculate_debug_metrics", trainer)
    gpu, sim = POOLS["h100"], POOLS["sim-h100"]
    for name in ("verl", "k8s", "slurm"):
        b = backend(name)
        bypass = b.unemitted(config_of(gpu, CorrectionSpec(policy="bypass")))
        assert M.PROB_DIFF_MAX in bypass and M.IS_OOB_RATIO in bypass, name
        icepop = CorrectionSpec(is_level="token", is_mode="mask", batch_norm=True)
        fp16 = LearnerSpec(precision="fp16")
        assert not b.unemitted(config_of(gpu, icepop, learner=fp16)), name
        assert M.SKIPPED_SHARE in b.unemitted(config_of(gpu, icepop)), name
        no_eval = b.unemitted(config_of(gpu, icepop, learner=fp16,
                                        recipe={"trainer": {"test_freq": -1}}))
        assert list(no_eval) == [M.EVAL_REWARD] and "test_freq: -1" in no_eval[M.EVAL_REWARD]
        assert not b.unemitted(config_of(gpu, icepop, learner=fp16,
                                         recipe={"trainer": {"test_freq": 5}}))
    slurm_sim = backend("slurm").unemitted(config_of(sim))
    assert M.IS_MASKED_FRACTION in slurm_sim and M.PROB_DIFF_MAX not in slurm_sim


# --------------------------------------------------------------------------- docs


def test_docs_state_the_pinned_engines_and_verls_best_effort_determinism() -> None:
    utils = (VERL / "workers/engine/utils.py").read_text()
    assert "torch.use_deterministic_algorithms(True, warn_only=True)" in utils
    engines_md = (REPO / "docs/engines.md").read_text()
    assert "vLLM >= 0.18" not in engines_md
    assert f"vLLM {_pin('vllm', 'vllm')}" in engines_md
    assert f"SGLang {_pin('sglang', 'sglang')}" in engines_md
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" in engines_md
    assert ">=0.18" not in (REPO / "pyproject.toml").read_text()
    learner_md = (REPO / "docs/learner.md").read_text()
    assert "warn_only=True" in learner_md and "not bitwise" in learner_md
