"""The GPU engines accept what the tool sends them, checked against the installed engines' own code.

For every value of the ``rollout.*`` vocabulary that ``orchestrator/verl/engines.py`` maps for
SGLang and vLLM, a grid with one trial per value is planned (``ablate plan --show-overrides
--json``); one subprocess per engine, in the GPU stack's environment (``ablate gpu-env sglang`` /
``ablate gpu-env vllm``), builds the engine's arguments from each trial's overrides on verl
0.9.1's own code path (``tests/verl/engine_contract_probe.py``) and returns the engine's report as
the project's engine hook records it in a job; the project's provenance comparison must find
every requested flag applied (``provenance.compare``: nothing unapplied, nothing unconfirmed).

What needs a GPU and is not checked here: SGLang's ``ServerArgs.__post_init__`` device check
("No accelerator is available"; the fields verl passes are SGLang's own and checked) and its
process launch (model load, CUDA graphs, NCCL); sgl_kernel's import (it loads libcuda.so.1: its
kernels are stand-ins here, none is called); vLLM's device inference in its argument parser's
``DeviceConfig`` (answered "cuda") and ``create_engine_config`` (platform checks; the
``EngineArgs`` it reads are checked instead); every numeric effect but one: the same
subprocess runs each engine's own sampler on small logits with the sampling parameters verl
sends (``tests/verl/logprob_semantics_probe.py``), and the log-probs it returns for the sampled
tokens are compared with the trainer's (what ``engines.logprob_problem`` rests on). There the
CUDA sampling kernels are not run: SGLang's flashinfer backend gets SGLang's torch sampling in
their place, vLLM takes its torch top-k/top-p path (the one processed log-probs use on a GPU).

Skipped with one line naming the setup command when the environment is absent; in CI
(``.ci/run`` builds both environments in the background, ``$ABLATE_CI_GPU_ENVS``) it waits for
the builds instead and fails if one failed. Cost: one plan per engine in-process (~2 s) and one
engine subprocess per engine (imports of torch, verl and the engine, then every case; the
samplers' log-prob cases add about 0.1 s): the whole file 45-56 s on the 2-core machine, 0 s
when skipped.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import typing
from pathlib import Path

import pytest
from gpu_envs import wait_for_ci_build

from orchestrator.engine import RolloutSpec
from orchestrator.verl import engine_hook, engine_versions, engines, gpu_setup, provenance

PROBE = Path(__file__).with_name("engine_contract_probe.py")
REPO = Path(__file__).resolve().parents[2]
# Values for flags whose table entry passes the value through (no value map).
PASS_THROUGH = {bool: (True, False), int: (1, 64), float: (0.7,)}
# What a case needs besides its flag so that the plan does not refuse the combination itself
# (those refusals have their own tests below).
COMPANIONS = {
    ("dtype", "fp32"): {"attention_backend": "triton"},
    ("kv_cache_dtype", "fp32"): {"dtype": "fp32", "attention_backend": "triton"},
    ("kv_cache_dtype", "fp16"): {"dtype": "fp16"},
}


def _domain(flag: str) -> tuple:
    annotation = RolloutSpec.model_fields[flag].annotation
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
        if arg in PASS_THROUGH:
            return PASS_THROUGH[arg]
    raise AssertionError(f"rollout.{flag}: no test values for {annotation}")


def cases(engine: str) -> dict[str, dict]:
    """name -> the trial's rollout.* flags: every value the engine's table maps to a key."""
    out = {}
    for flag, entries in engines.TABLES[engine].items():
        keys = [e for e in entries if isinstance(e, engines.Key)]
        if not keys:
            continue
        refused = [e for e in entries if isinstance(e, engines.Refused)]
        values = []
        for key in keys:
            values += list(key.values) if key.values is not None else list(_domain(flag))
        for value in dict.fromkeys(values):
            if any(r.applies(value) for r in refused):
                continue
            flags = {flag: value, **COMPANIONS.get((flag, value), {})}
            spec = RolloutSpec(**flags)
            if engines.check_engine(spec, engine) or engine_versions.check_version(spec, engine,
                                                                                   None):
                continue  # a refusal of the plan: tested below
            out[f"{flag}={provenance.text(value)}"] = flags
    return out


def _plan(tmp: Path, engine: str, named: dict[str, dict]) -> dict[str, list[str]]:
    """Each case's verl overrides as `ablate plan --show-overrides --json` emits them."""
    import yaml

    from orchestrator.cli.parser import main

    grid = tmp / f"contract-{engine}.yaml"
    grid.write_text(yaml.safe_dump({
        "name": f"contract-{engine}", "recipe": "verl/qwen25_32b_dapo_vllm", "backend": "verl",
        "steps": 2, "seeds": [0], "pool": "h20",
        "axes": {"case": {n: {"rollout.engine": engine, **{f"rollout.{k}": v for k, v in f.items()}}
                          for n, f in named.items()}}}))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["plan", str(grid), "--show-overrides", "--json"]) == 0
    plan = json.loads(out.getvalue())
    return {t["axes"]["case"]: t["backend_args"] for t in plan["trials"]}


def _probe(engine: str, tmp_path_factory) -> dict:
    wait_for_ci_build(engine)
    env = gpu_setup.env_dir(engine)
    python = env / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"no {engine} GPU environment at {env}; make it with: ablate gpu-env {engine}")
    named = cases(engine)
    overrides = _plan(tmp_path_factory.mktemp(engine), engine, named)
    # This checkout's code, whatever the environment's own rl-ablate points to (an environment
    # cached by its lock's hash was made from an earlier checkout, .ci/run).
    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([str(python), str(PROBE)], input=json.dumps(
        {"engine": engine, "cases": overrides}), capture_output=True, text=True, timeout=900,
        cwd=REPO, check=False, env=env_vars)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["flags"] = named
    return result


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    return _probe("sglang", tmp_path_factory)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    return _probe("vllm", tmp_path_factory)


# Keys verl reads itself and passes to no engine argument: no engine report can confirm them.
# Found by this test: rollout.deterministic: false on vLLM maps to verl's full_determinism
# (vllm_async_server.py:149), which no EngineArgs / VllmConfig field carries, so a real trial's
# provenance lists it as unconfirmed too (orchestrator/verl/provenance.py VERL_SIDE lacks it).
NOT_ENGINE_ARGS = {("vllm", "deterministic=false")}


def _applied(result: dict, engine: str) -> list[str]:
    problems = []
    for name, flags in result["flags"].items():
        if (engine, name) in NOT_ENGINE_ARGS:
            continue
        case = result["cases"][name]
        if case["error"]:
            problems.append(f"{name}: the engine refused it: {case['error']} ({case['stage']})")
            continue
        reports = [provenance.EngineReport(r["engine"], r["version"],
                                           {k: provenance.text(v) for k, v in r["settings"].items()})
                   for r in case["reports"]]
        prov = provenance.compare(RolloutSpec(engine=engine, **flags), reports,
                                  table_engine=engine, engine=engine)
        if prov.unapplied or prov.unconfirmed or not reports:
            problems.append(f"{name}: {prov.warning() or 'no engine report'} ({case['stage']})")
    return problems


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_versions_equal_the_lock(engine, request):
    result = request.getfixturevalue(engine)
    pins = gpu_setup.lock_pins(engine)
    assert result["versions"] == {p: pins[p] for p in ("verl", engine)}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_mapped_value_lands_where_the_table_says(engine, request):
    result = request.getfixturevalue(engine)
    assert len(result["flags"]) >= 15
    assert _applied(result, engine) == []


def test_hook_fields_exist_in_the_installed_classes(sglang, vllm):
    """Provenance reads these paths back (engine_hook.SGLANG_FIELDS / VLLM_FIELDS): a rename in
    an engine upgrade fails here."""
    assert set(engine_hook.SGLANG_FIELDS.values()) - set(sglang["fields"]["ServerArgs"]) == set()
    missing = []
    for path in engine_hook.VLLM_FIELDS.values():
        section, leaf = path.split(".")
        if leaf not in vllm["fields"].get(section, ()):
            missing.append(path)
    assert missing == []


# ----------------------------------------------------------------- the plan's refusals, engine side


def test_vllm_024_does_not_apply_head_dtype_to_a_generative_lm_head(vllm):
    """rollout.lm_head_fp32 on vLLM 0.24 is refused (engine_versions.MIN_VERSIONS): its logits
    processor, which computes a generative model's LM head, never reads head_dtype."""
    assert vllm["versions"]["vllm"] == "0.24.0"
    assert vllm["facts"]["logits_processor_reads_head_dtype"] is False
    assert engine_versions.check_version(RolloutSpec(lm_head_fp32=True), "vllm", None)


def test_vllm_attention_names_exist(vllm):
    """The attention backends the vLLM table maps to are members of vLLM's own enum. (Whether
    its TORCH_SDPA serves a decoder on a GPU, which the torch_native refusal says it does not,
    is decided at engine start-up: not shown here.)"""
    backends = set(vllm["facts"]["attention_backends"])
    assert set(engines.VLLM_ATTENTION.values()) <= backends


def test_sglang_refusals_rest_on_what_verl_and_sglang_do(sglang):
    """logprobs_mode: raw is refused on SGLang (verl passes logprobs_mode to vLLM only);
    cudagraph_mode is refused (ServerArgs has no CUDA-graph mode, only on/off); fa3 is refused
    and fp32 with the default attention is refused because verl's default from SGLang 0.5.12 is
    flashinfer (a half-only kernel; its dtype check runs in the kernel, on a GPU)."""
    facts = sglang["facts"]
    assert facts["verl_sglang_passes_logprobs_mode"] is False
    assert facts["verl_vllm_passes_logprobs_mode"] is True
    assert "disable_cuda_graph" in sglang["fields"]["ServerArgs"]
    assert not [f for f in facts["server_args_cudagraph_fields"] if "mode" in f]
    default = sglang["cases"]["dtype=bf16"]["reports"][0]["settings"]["attention_backend"]
    assert default == "flashinfer"
    assert engine_versions.check_version(RolloutSpec(dtype="fp32"), "sglang", None)
    assert engine_versions.check_version(RolloutSpec(attention_backend="fa3"), "sglang", None)


# ----------------------------------------------------------------- the log-probs the engines return
# Each engine's own sampler run on small logits with the sampling parameters verl sends
# (logprob_semantics_probe.py): per case the largest difference between the log-probs it
# returns for its sampled tokens and log_softmax(logits / T) over the whole vocabulary ("full",
# what verl's trainer recomputes), log_softmax(logits) ("raw", before temperature) and the
# log-prob renormalised over the top-p / top-k set ("nucleus").

SAME = 1e-5  # float32 log-probs of one distribution
# Two different distributions: on the probe's logits every truncated case cuts at least 0.15
# nats of mass (log_mass_of_nucleus) and T=0.7 moves the sampled tokens' log-probs by > 0.3.
APART = 1e-2


def _logprobs(result: dict) -> dict:
    record = result["logprobs"]
    assert "error" not in record, f"{record.get('error')}\n{record.get('where')}"
    return record


def _truncated(case: dict) -> bool:
    return case["log_mass_of_nucleus"] < -APART


def test_sglang_returns_full_vocabulary_log_probs_at_the_sampling_temperature(sglang):
    """SGLang 0.5.12 ``Sampler.forward`` (sglang/srt/layers/sampler.py:171-185): the log-probs
    are ``log(softmax(logits / T))`` taken before the top-k / top-p sampling
    (``_sample_from_probs`` filters its own sorted copy), so over the whole vocabulary at the
    sampling temperature, on both sampling backends, while the sampled tokens come from the
    nucleus. flashinfer's sampling op declares that it writes nothing (``mutates_args=()``)."""
    record = _logprobs(sglang)
    assert record["version"] == "0.5.12"
    assert record["flashinfer_sampling_op_mutates_nothing"] is True
    assert '"flashinfer" if is_flashinfer_available()' in record["backend_choice"]
    cases = {n: c for n, c in record["cases"].items() if not c["original_logprob"]}
    assert {c["backend"] for c in cases.values()} == {"flashinfer", "pytorch"}
    for name, case in cases.items():
        assert case["full"] < SAME, name
        assert case["in_nucleus"], name
        if _truncated(case):
            assert case["nucleus"] > APART, name
            assert case["need_top_p_sampling"] or case["need_top_k_sampling"], name
    assert cases["T=0.7 flashinfer"]["raw"] > APART
    assert sum(_truncated(c) for c in cases.values()) >= 8


def test_sglang_return_original_logprob_is_before_temperature_and_unset_by_verl(sglang):
    """``SGLANG_RETURN_ORIGINAL_LOGPROB`` (read once at import, sampler.py:52) swaps in
    ``log_softmax(logits)`` before temperature (sampler.py:136-137, :190-191): the trainer's
    only at temperature 1. verl 0.9.1 never sets it, nor ``rl_on_policy_target`` (bf16
    log-probs, sampler.py:141-148; ServerArgs default None) nor the sampling backend."""
    record = _logprobs(sglang)
    env = record["original_logprob_env"]
    assert env["reads_env"] is True
    assert env["value_here"] is env["set_here"] is False
    swapped = [c for c in record["cases"].values() if c["original_logprob"]]
    assert len(swapped) == 2
    for case in swapped:
        assert case["raw"] < SAME and case["full"] > APART
    assert record["server_args_defaults"] == {"sampling_backend": None,
                                              "rl_on_policy_target": None,
                                              "enable_deterministic_inference": False}
    mentions = record["verl_mentions"]
    assert mentions["SGLANG_RETURN_ORIGINAL_LOGPROB"] == mentions["rl_on_policy_target"] == []
    assert mentions["sampling_backend"] == []


def test_vllm_processed_log_probs_are_the_nucleus_and_raw_ones_precede_temperature(vllm):
    """vLLM 0.24.0, V1 model runner: processed_logprobs are ``log_softmax`` of the logits after
    ``apply_top_k_top_p`` (vllm/v1/sample/ops/topk_topp_sampler.py:135-140, the path a GPU takes
    too whenever processed log-probs are asked for, :86-95), renormalised over the nucleus;
    raw_logprobs are taken from the logits before temperature and truncation
    (vllm/v1/sample/sampler.py:84-88). The V2 model runner (vllm/v1/worker/gpu/sample/
    sampler.py:104-106, :234) takes the same tensors."""
    record = _logprobs(vllm)
    assert record["version"] == "0.24.0"
    cases = record["cases"]
    for name, case in cases.items():
        assert case["in_nucleus"], name
        if case["mode"] == "processed_logprobs":
            assert case["nucleus"] < SAME, name
            if _truncated(case):
                assert case["full"] > APART, name
        else:
            assert case["raw"] < SAME, name
    assert cases["T=0.7 raw_logprobs"]["full"] > APART
    assert {c["top_k_top_p_forward"] for c in cases.values()
            if c["mode"] == "processed_logprobs"} == {"forward_native"}
    assert record["v1_raw_before_temperature"] is True
    assert record["v2_processed_after_top_k_top_p"] is True
    assert record["v2_raw_is_the_input_logits"] is True


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_logprob_problem_refuses_exactly_where_the_engine_returns_other_log_probs(engine,
                                                                                  request):
    """``engines.logprob_problem`` against what the engine's sampler returned: a refusal where
    the returned log-probs are not full-vocabulary log_softmax(logits / T), none where they
    are."""
    record = _logprobs(request.getfixturevalue(engine))
    wrong = []
    for name, case in record["cases"].items():
        params = case["params"]
        env = {engines.SGLANG_ORIGINAL_LOGPROB: "1"} if case.get("original_logprob") else {}
        problem = engines.logprob_problem(engine, top_p=params["top_p"], top_k=params["top_k"],
                                          temperature=params["temperature"],
                                          logprobs_mode=case.get("mode"), engine_env=env)
        differs = case["full"] > APART
        if (problem is not None) != differs:
            wrong.append(f"{name}: returned log-probs {'differ from' if differs else 'equal'} "
                         f"the trainer's, refusal: {problem}")
    assert wrong == []


# ----------------------------------------------------------------- the setup command (no env needed)


def test_locks_pin_the_stacks_and_name_their_command():
    for stack, engine_version in (("sglang", "0.5.12"), ("vllm", "0.24.0")):
        pins = gpu_setup.lock_pins(stack)
        assert pins["verl"] == "0.9.1" and pins[stack] == engine_version
        assert pins["transformers"] == "5.9.0" and pins["torch"] == "2.11.0"
        text = gpu_setup.lock_path(stack).read_text()
        assert "uv pip compile pyproject.toml" in text and text.count("--hash=sha256:") > len(pins)


def test_a_pool_naming_a_missing_gpu_env_is_refused_at_plan(tmp_path, capsys):
    import yaml

    from orchestrator.cli.parser import main

    catalog = yaml.safe_load((REPO / "orchestrator" / "pools.yaml").read_text())
    pool = catalog["pools"]["h20"]
    pool["engine_envs"] = {"sglang": str(tmp_path / "no-env")}
    (tmp_path / "pools.yaml").write_text(yaml.safe_dump({"pools": {"h20": pool}}))
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({
        "name": "env", "recipe": "verl/qwen25_32b_dapo_vllm", "backend": "verl", "steps": 2,
        "seeds": [0], "pool": "h20", "pool_catalog": "pools.yaml",
        "axes": {"rollout.engine": ["sglang"]}}))
    assert main(["plan", str(grid)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error")]) == 1
    assert f"fix: run ablate gpu-env sglang --env {tmp_path / 'no-env'}" in err[-1]
    assert "is not created" in err[-1]
