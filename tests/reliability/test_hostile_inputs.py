"""The adversarial inputs of issue #19 (special files and sizes, values that cannot run, YAML 1.1
numbers), through the real CLI in a subprocess, as a user would meet them: exit code 2, one
short line naming the file, no traceback, nothing written, and never a hang (every run has a
timeout well above what it needs)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import cliproc
import pytest

HEAD = "name: hostile\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 20\npool: sim-h100\n"


def _grid(body: str, head: str = HEAD) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        (d / "g.yaml").write_text(head + body)
        return d / "g.yaml"
    return make


def _link_to_zero(d: Path) -> Path:
    (d / "g.yaml").symlink_to("/dev/zero")
    return d / "g.yaml"


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "g.yaml")
    return d / "g.yaml"


def _catalog_fifo(d: Path) -> Path:
    os.mkfifo(d / "pools.yaml")
    return _grid("pool_catalog: pools.yaml\n")(d)


def _many_seeds(d: Path) -> Path:
    return _grid("seeds: [" + ",".join(str(i) for i in range(150_000)) + "]\n")(d)


def _long_axis(d: Path) -> Path:
    return _grid("seeds: [0, 1, 2]\naxes:\n  train.lr: ["
                 + ",".join(f"{i}.0e-7" for i in range(1, 40_001)) + "]\n")(d)


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "dev_zero_link": (_link_to_zero, "is a character device, not a regular file"),
    "fifo_grid": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "fifo_catalog": (_catalog_fifo, "pool_catalog: "),
    "catalog_dev_zero": (_grid("pool_catalog: /dev/zero\n"), "is a character device"),
    "150k_seeds": (_many_seeds, "holds more than 50000 values"),
    "40k_axis_3_seeds": (_long_axis, "grid expands to up to 120000 trials, over the limit 100000"),
    "100k_key": (_grid("axes:\n  ? " + "k" * 100_000 + "\n  : [1, 2]\n"), "[100006 chars]"),
    "sexagesimal_steps": (_grid("", HEAD.replace("steps: 20", "steps: 1:30")), "YAML 1.1 reads it as 90"),
    "n_layers_zero": (_grid("overrides: {model.n_layers: 0}\n"), "model.n_layers: must be in 1..256"),
    "negative_lr": (_grid("overrides: {train.lr: -1.0e-3}\n"), "train.lr: must be > 0"),
    "eval_every_zero": (_grid("overrides: {eval.every: 0}\n"), "eval.every: must be >= 1"),
    "threads": (_grid("overrides: {train.threads: 4096}\n"), "train.threads: must be in 1.."),
    "store_scheme": (_grid("checkpoint: {store: 'nope://x'}\n"), "unknown URL scheme 'nope'"),
    "rule_metric": (_grid("collapse: {extra_rules: [{name: r, metric: typo, kind: above}]}\n"),
                    "the rule could never fire"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_line_exit_2(case: str, tmp_path: Path) -> None:
    make, expect = CASES[case]
    grid = make(tmp_path)
    env = {**os.environ, "ABLATE_WORKDIR": str(tmp_path / ".ablate")}
    proc = cliproc.run(["plan", str(grid)], env, tmp_path, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 1000, proc.stderr[:2000]
    assert proc.stderr.startswith(f"error: {grid}") and expect in proc.stderr, proc.stderr
    assert not (tmp_path / ".ablate").exists()


def test_a_long_path_in_a_message_stays_whole_a_huge_value_is_cut() -> None:
    """The file a message names is what the user acts on: a 200-character path (a workdir deep
    in a shared file system) is kept whole; a 100k-character key or path is still cut."""
    from orchestrator.exceptions import UserError

    path = "/" + "/".join(["d" * 30] * 6) + "/trials/t1/attempts.json"
    assert 150 < len(path) < 1024
    assert f"{path}: corrupt JSON state file" in str(UserError(f"{path}: corrupt JSON state file"))
    for huge in ("k" * 100_000, "/" + "p" * 5000):
        message = str(UserError(f"bad key {huge} (fix: rename it)"))
        assert f"...[{len(huge)} chars]" in message and len(message) < 300
