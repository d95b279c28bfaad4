"""The environments ``ablate gpu-env`` makes (the GPU stacks, Miles' parser), as tests that run
code inside them find them: in CI (``.ci/run`` builds them in the background beside the suite,
``$ABLATE_CI_GPU_ENVS``) a test waits for its build, fails with the build's log if it failed,
and skips with the reason if CI skipped it (too little disk). Outside CI: nothing to wait for."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

CI_BUILD = "ABLATE_CI_GPU_ENVS"  # .ci/run: the folder where its background builds report
CI_WAIT_S = 3600.0


def wait_for_ci_build(stack: str) -> None:
    folder = os.environ.get(CI_BUILD)
    if not folder:
        return
    rc, log = Path(folder) / f"{stack}.rc", Path(folder) / f"{stack}.log"
    deadline = time.monotonic() + CI_WAIT_S
    while not (rc.is_file() and rc.read_text().strip()):
        if time.monotonic() > deadline:
            pytest.fail(f"the {stack} environment's CI build did not end in {CI_WAIT_S:.0f} s")
        time.sleep(5)
    status = rc.read_text().strip()
    if status.startswith("skipped"):
        pytest.skip(f"CI did not build the {stack} environment: {status}")
    tail = log.read_text()[-3000:] if log.is_file() else ""
    assert status == "0", f"the {stack} environment's CI build failed ({status}):\n{tail}"
