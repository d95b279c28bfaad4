"""``benchmarks/compare_scale.py`` runs against the current runner (its generated trainer is a
``Trainer``: it had fallen behind the interface and could not record at all), and times each
checkout in turns, so no figure is measured only after another command warmed the cache."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_scale.py"


def _module():
    spec = importlib.util.spec_from_file_location("compare_scale_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_tiny_grid_records_and_its_status_is_timed_twice(tmp_path: Path) -> None:
    out = tmp_path / "cs.json"
    res = subprocess.run([sys.executable, str(BENCH), "--trials", "20", "--steps", "3",
                          "--metrics", "4", "--status-only", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert [r["position"] for r in row["runs"]] == [1, 2]
    assert 0 < row["status_s"] == round(sum(r["status_s"] for r in row["runs"]) / 2, 2)


def test_with_a_baseline_each_checkout_runs_first_and_last_in_turn() -> None:
    mod = _module()
    calls: list[str] = []

    def run(checkout: Path, tag: str) -> dict[str, float]:
        calls.append(str(checkout))
        return {"status_s": 1.0 if tag else 3.0 + len(calls)}

    ours, theirs = mod._in_turns(Path("new"), Path("old"), run)
    assert calls == ["old", "new", "new", "old"]
    assert [r["position"] for r in ours["runs"]] == [2, 3] and ours["status_s"] == 5.5
    assert [r["position"] for r in theirs["runs"]] == [1, 4] and theirs["status_s"] == 1.0
