"""Engine provenance: the hook's reports from the engine's own objects, and the comparison.

SGLang and vLLM cannot run on this CPU machine, so their modules are stand-ins with the same
names and the hooked entry points (``ServerArgs.__post_init__``, ``EngineArgs.create_engine_config``);
the real engines are checked by ``tests/verl/test_engine_gpu.py`` (``-m gpu``). The CPU
engine's report comes from a real verl job in ``tests/verl_cpu``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator.backends import TrialConfig
from orchestrator.engine import RolloutSpec
from orchestrator.pools import load_catalog
from orchestrator.verl import provenance as P
from orchestrator.verl.supervise import _engine_check

FAKE_SGLANG = '''
import dataclasses
__version__ = "0.5.12"
@dataclasses.dataclass
class ServerArgs:
    dtype: str = "auto"
    disable_cuda_graph: bool = False
    chunked_prefill_size: int | None = None
    attention_backend: str | None = None
    def __post_init__(self):
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = 8192     # SGLang resolves its defaults here
        self.attention_backend = self.attention_backend or "flashinfer"
'''
FAKE_VLLM = '''
import enum, types
__version__ = "0.33.0"
class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
class EngineArgs:
    def __init__(self, **kw): self.kw = kw
    def create_engine_config(self):
        ns = types.SimpleNamespace
        return ns(model_config=ns(dtype="torch.bfloat16", enforce_eager=self.kw.get("enforce_eager", False),
                                  quantization=None, logprobs_mode="processed_logprobs",
                                  hf_overrides={"head_dtype": "float32"}),
                  cache_config=ns(cache_dtype="auto", enable_prefix_caching=True),
                  scheduler_config=ns(enable_chunked_prefill=True, max_num_seqs=1024,
                                      async_scheduling=False),
                  compilation_config=ns(cudagraph_mode=CUDAGraphMode.PIECEWISE))
'''


def _fake_engines(root: Path) -> None:
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text('__version__ = "0.5.12"\n')
    (root / "sglang" / "srt" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "server_args.py").write_text(FAKE_SGLANG)
    (root / "vllm" / "engine").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text('__version__ = "0.33.0"\n')
    (root / "vllm" / "engine" / "__init__.py").write_text("")
    (root / "vllm" / "engine" / "arg_utils.py").write_text(FAKE_VLLM)


def test_the_hook_reports_what_the_engines_resolved(tmp_path: Path) -> None:
    """In a fresh process (as in the job): the hook is imported first, the engines later."""
    _fake_engines(tmp_path)
    log = tmp_path / "engine.jsonl"
    code = textwrap.dedent("""
        import orchestrator.verl.engine_hook
        from sglang.srt.server_args import ServerArgs
        ServerArgs(dtype="bfloat16", disable_cuda_graph=True)
        from vllm.engine.arg_utils import EngineArgs
        EngineArgs(enforce_eager=True).create_engine_config()
    """)
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{repo}:{tmp_path}", P.LOG_ENV: str(log)}, timeout=60)
    assert out.stdout.count("ABLATE_ENGINE {") == 2
    sg, vl = P.read_reports(log)
    assert (sg.name, sg.version) == ("sglang", "0.5.12")
    assert sg.settings == {"dtype": "bfloat16", "disable_cuda_graph": "true",
                           "chunked_prefill_size": "8192", "attention_backend": "flashinfer"}
    assert (vl.name, vl.version) == ("vllm", "0.33.0")
    assert vl.settings["enforce_eager"] == "true" and vl.settings["dtype"] == "bfloat16"
    assert vl.settings["cudagraph_mode"] == "piecewise" and vl.settings["head_dtype"] == "float32"
    assert vl.settings["batch_invariant"] == "0"


def test_requested_flags_against_the_report() -> None:
    report = P.EngineReport("sglang", "0.5.12", {"disable_cuda_graph": "true",
                                                 "chunked_prefill_size": "8192",
                                                 "attention_backend": "flashinfer"})
    asked = RolloutSpec(enforce_eager=True, chunked_prefill=False, attention_backend="fa3",
                        free_cache_engine=False, lm_head_fp32=True)
    prov = P.compare(asked, [report], table_engine="sglang", engine="sglang")
    assert prov.unapplied == [
        "rollout.chunked_prefill (asked chunked_prefill_size=-1, engine ran 8192)",
        "rollout.attention_backend (asked attention_backend=fa3, engine ran flashinfer)"]
    assert prov.unconfirmed == ["rollout.lm_head_fp32"]  # free_cache_engine is verl-side
    assert prov.facts["engine.name"] == "sglang" and prov.facts["engine.version"] == "0.5.12"
    assert prov.facts["engine.ran.disable_cuda_graph"] == "true"
    assert "did not apply rollout.chunked_prefill" in prov.warning()
    ok = P.compare(RolloutSpec(enforce_eager=True), [report], table_engine="sglang", engine="sglang")
    assert ok.warning() is None and ok.facts["engine.unapplied"] == "none"


def test_vllm_names_and_every_replica_must_agree() -> None:
    asked = RolloutSpec(engine="vllm", cudagraph_mode="piecewise", chunked_prefill=False,
                        lm_head_fp32=True, max_num_seqs=1)
    good = {"cudagraph_mode": "piecewise", "enable_chunked_prefill": "false",
            "head_dtype": "float32", "max_num_seqs": "1"}
    prov = P.compare(asked, [P.EngineReport("vllm", "0.33.0", good)] * 2,
                     table_engine="vllm", engine="vllm")
    assert prov.warning() is None, prov.warning()
    split = P.compare(asked, [P.EngineReport("vllm", "0.33.0", good),
                              P.EngineReport("vllm", "0.33.0", {**good, "max_num_seqs": "1024"})],
                      table_engine="vllm", engine="vllm")
    assert split.unapplied == ["rollout.max_num_seqs (asked max_num_seqs=1, engine ran 1/1024)"]


def test_strict_turns_a_gap_into_a_reason_to_stop(tmp_path: Path) -> None:
    log = tmp_path / "engine.jsonl"
    log.write_text(json.dumps({"engine": "cpu", "version": "x", "settings": {"dtype": "bfloat16"}})
                   + "\n")
    def on_cpu(rollout: dict) -> TrialConfig:
        return TrialConfig.of({"rollout": rollout}, load_catalog().get("cpu-bf16"))

    reason = _engine_check(on_cpu({"dtype": "fp32", "provenance": "strict"}), log)()
    assert reason == ("rollout.provenance: strict and the engine did not apply rollout.dtype "
                      "(asked dtype=float32, engine ran bfloat16)")
    assert _engine_check(on_cpu({"dtype": "fp32"}), log)() is None  # warn only
    assert _engine_check(on_cpu({"dtype": "bf16", "provenance": "strict"}), log)() is None
    assert P.read_reports(tmp_path / "absent.jsonl") == []


def test_settings_compare_as_text_whatever_type_the_engine_used() -> None:
    import enum

    class Mode(enum.Enum):
        PIECEWISE = 1

    assert [P.text(v) for v in (True, None, 0.7, -1, "torch.bfloat16", Mode.PIECEWISE,
                                "AttentionBackendEnum.FLASH_ATTN", "fp8_e4m3", {"b": 1})] == [
        "true", "none", "0.7", "-1", "bfloat16", "piecewise", "flash_attn", "fp8_e4m3",
        '{"b": 1}']
