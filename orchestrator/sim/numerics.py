"""Pinned CPU numerics: the same simulator numbers on every x86-64 machine with AVX2.

Which kernels torch, MKL and oneDNN run depends on the processor (AVX2, AVX-512, native bf16,
AMX), and so does their arithmetic: vector width changes the order of reductions, and each
instruction set has its own exp/log approximations. GRPO amplifies last-bit differences within
tens of steps, so an unpinned run holds on the machine that produced it only.

Pinning fixes one instruction-set level for every library that dispatches on the CPU, through the
variables each reads once, at its first use -- hence before ``torch`` is imported:

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's vectorised CPU kernels (softmax, layer norm, reductions,
  elementwise math);
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility (the fp32 GEMMs) on its
  vendor-neutral code path. ``MKL_CBWR=AVX2`` is not enough: MKL runs a different AVX2 sgemm on
  Intel than on AMD processors (measured: an emulated Haswell and an emulated or real Zen 2 give
  different GEMM and cumsum results under it, the same ones under COMPATIBLE);
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's instruction-set cap (anything routed through it).

The simulator's low-precision GEMMs are computed explicitly as fp32 GEMMs over rounded operands
(``sim/rollout.py``), so no native bf16/fp16 kernel (AVX512-BF16, AMX, or a slow fallback) decides
its arithmetic either. The thread count is pinned per trial (``train.threads``).

What this does not cover: non-x86 machines (ARM has neither MKL nor these levels: numbers there
are their own), x86 machines without AVX2 (nothing is pinned; the record says so), and other
versions of torch/MKL/oneDNN (recorded, and ``ablate compare`` warns when trials differ).

Torch-free at import: the CLI pins before anything imports torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# CPU flags that decide which kernels the libraries would pick unpinned (recorded, not compared:
# pinned runs give the same numbers whatever they say).
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "avx_vnni")
# The facts two runs must share to give the same numbers: compared by ``fingerprint``.
DECIDING = ("reproducible", "machine", "levels", "torch", "mkl", "onednn")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    m = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    m = re.search(r"^model name\s*:\s*(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else (platform.processor() or "unknown")


def pinnable() -> str | None:
    """Why this machine cannot be pinned (None when it can): x86-64 with AVX2 and FMA."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64 (no MKL, no AVX2 level to pin)"
    flags = cpu_flags()
    if flags and not {"avx2", "fma"} <= flags:
        return "this x86-64 CPU has no AVX2/FMA"
    return None


def target_env(reproducible: bool) -> dict[str, str | None]:
    """The numeric variables a simulator process should start with (None: unset)."""
    if reproducible and pinnable() is None:
        return dict(PINNED)
    return {k: None for k in PINNED}


def apply(reproducible: bool = True, environ: Any = None) -> dict[str, str | None]:
    """Set (or, for an opted-out run, unset) the pinned variables in ``environ`` (``os.environ``)
    and return the previous values. Effective only in a process that has not imported torch yet
    and for the processes it starts afterwards (Ray's raylet and workers inherit them)."""
    env = os.environ if environ is None else environ
    saved = {k: env.get(k) for k in PINNED}
    for key, value in target_env(reproducible).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return saved


def ensure_pinned() -> None:
    """For command-line entry points (``python -m orchestrator.sim.calibrate``, benchmarks): run
    this process pinned. The variables are set at once if torch is not imported yet; otherwise
    the same command line is executed again with them set (each library reads them once)."""
    target = target_env(True)
    if all(os.environ.get(k) == v for k, v in target.items() if v is not None):
        return
    apply(True)
    if "torch" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def restore(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _library_versions() -> dict[str, str]:
    import torch  # deferred: this module is imported by torch-free plan-time code

    shown = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", shown)
    dnn = re.search(r"(?:MKL-DNN|oneDNN) v([\w.\-]+)", shown)
    return {"torch": torch.__version__, "mkl": mkl.group(1) if mkl else "none",
            "onednn": dnn.group(1) if dnn else "none",
            "aten_capability": str(torch.backends.cpu.get_cpu_capability()),
            "threads": str(torch.get_num_threads())}


def describe(requested: bool) -> dict[str, Any]:
    """The numeric environment this process really runs under (torch imported here).

    ``reproducible`` is true only when the run asked for it and every pinned variable holds its
    value; ``why`` says otherwise (a process that imported torch before pinning, a machine that
    cannot be pinned, an opt-out)."""
    libs = _library_versions()
    levels = {k: os.environ.get(k, "") for k in PINNED}
    why = ""
    if not requested:
        why = "sim.reproducible: false (opted out)"
    elif pinnable() is not None:
        why = pinnable() or ""
    elif levels != PINNED or libs["aten_capability"] != "AVX2":
        why = ("the process did not start with the pinned numeric variables "
               f"(ATen runs {libs['aten_capability']}); start it through ablate or set "
               + " ".join(f"{k}={v}" for k, v in PINNED.items()))
    flags = cpu_flags()
    return {
        "reproducible": not why, "why": why, "machine": platform.machine(),
        "cpu": cpu_model(), "cpu_flags": ",".join(f for f in FLAGS if f in flags),
        "levels": ",".join(f"{k}={v or 'unset'}" for k, v in levels.items()),
        **libs, "python": sys.version.split()[0],
    }


def fingerprint(env: Mapping[str, Any]) -> str:
    """A short id of what decides the numbers: equal fingerprints, equal arithmetic. An unpinned
    run's numbers also depend on its CPU, so its CPU model and flags are part of its id."""
    keys = DECIDING if env.get("reproducible") in (True, "true") else (
        *DECIDING, "cpu", "cpu_flags", "aten_capability")
    blob = json.dumps({k: str(env.get(k, "")).lower() if k == "reproducible" else str(env.get(k, ""))
                       for k in keys}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def environments(facts: Iterable[Mapping[str, str]]) -> dict[str, tuple[int, str]]:
    """Distinct numeric environments among trials' facts: fingerprint -> (trials, summary).
    Trials without facts (other backends, older runs) are left out."""
    out: dict[str, tuple[int, str]] = {}
    for env in facts:
        fp = env.get("fingerprint")
        if fp:
            n, _ = out.get(fp, (0, ""))
            out[fp] = (n + 1, summary(env))
    return out


def summary(env: Mapping[str, Any]) -> str:
    """One line for tables and warnings (``env``: :func:`describe`'s facts, or the same read
    back from ``numerics.*`` tags, where booleans are strings)."""
    pinned = env.get("reproducible") in (True, "true")
    kind = "pinned AVX2" if pinned else f"unpinned ({env.get('why') or '?'})"
    return (f"{kind}; torch {env.get('torch')}, MKL {env.get('mkl')}, oneDNN {env.get('onednn')}; "
            f"{env.get('machine')} {env.get('cpu')}")
