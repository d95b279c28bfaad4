"""Where ``ablate compare``'s seconds go, per phase, on a grid ``compare_scale.py`` recorded.

Runs ``ablate compare`` once with the workdir and once against a loopback ``mlflow server`` (as
``ablate ui`` starts it) with an empty workdir, each in a fresh process under ``cProfile``, with
compare's cache off (``ABLATE_CACHE_DIR=off``: every piece is computed), and reports the
cumulative seconds of each phase: imports, the MLflow client, listing the runs, the workdir's
summaries, the curves from the server, the curve plots, the fANOVA forests, the other figures
and sections, the files written, the manifest and the publishing to the grid's parent run.

Phases nest (a phase's figure includes the imports it triggers, ``load_results`` includes
listing the runs), so they do not add up to the total. A piece that ``compare`` runs in a forked
child (past 200 trials on two cores: the curve plots and the forests) shows as the parent's wait
for it. ``cProfile`` slows Python-heavy code more than C-heavy code (drawing, fitting): the figures
say where time goes, not what a command takes (``compare_scale.py`` says that).

    python benchmarks/compare_profile.py /tmp/scale-keep/t1000-s300-m40 --json FILE
"""
from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compare_scale import _loadavg, emit, mlflow_server

REPO = Path(__file__).resolve().parents[1]
# phase -> (a path suffix of the function's file, its name); the first match counts.
PHASES: dict[str, tuple[str, str]] = {
    "total": ("orchestrator/cli/commands.py", "compare_body"),
    "imports (all, wherever triggered)": ("<frozen importlib._bootstrap>", "_find_and_load"),
    "mlflow client": ("orchestrator/tracking/_store.py", "client"),
    "load_results (runs, summaries, curves)": ("orchestrator/compare/_data.py", "load_results"),
    "  search_runs (the run list)": ("orchestrator/compare/_data.py", "search_trial_runs"),
    "  workdir summaries and checks": ("orchestrator/store/summary_table.py", "read"),
    "  the grid's summary table (download, decode)": ("orchestrator/tracking/_summaries.py",
                                                     "published_summaries"),
    "  curves from the server": ("orchestrator/compare/_fetch.py", "fetch_curves"),
    "  reference scores": ("orchestrator/compare/_data.py", "merge_reference"),
    "build_report (tables, figures, sections)": ("orchestrator/compare/_report.py", "build_report"),
    "  curve plots (started)": ("orchestrator/compare/_plots.py", "report_curves"),
    "  fANOVA (in this process)": ("orchestrator/compare/_stats.py", "fanova_importance"),
    "  waiting for the forked children (curve plots, fANOVA)": ("orchestrator/compare/_background.py",
                                                                "wait"),
    "  cells and intervals": ("orchestrator/compare/_report.py", "pivot"),
    "  cells.csv, trials.csv": ("orchestrator/compare/_report.py", "_write_csvs"),
    "  main effects": ("orchestrator/compare/_stats.py", "main_effects"),
    "  mismatch plot": ("orchestrator/compare/_plots.py", "mismatch_by_bucket"),
    "  verdict map": ("orchestrator/compare/_plots.py", "verdict_map"),
    "  survival": ("orchestrator/compare/_survival.py", "survival_section"),
    "  cost": ("orchestrator/compare/_cost.py", "cost_section"),
    "  comparisons": ("orchestrator/compare/_cost.py", "comparison_section"),
    "  importance plot": ("orchestrator/compare/_plots.py", "importance_bars"),
    "  summary.md": ("orchestrator/compare/_report.py", "render_markdown"),
    "  summary.html": ("orchestrator/compare/_report.py", "render_html"),
    "manifest": ("orchestrator/compare/manifest.py", "write"),
    "publish to the parent run (results, summary table)": ("orchestrator/compare/_parent.py",
                                                           "log_to_parent"),
    "terminal table": ("orchestrator/compare/_report.py", "print_table"),
}


def phases(prof: Path) -> dict[str, float]:
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for phase, (suffix, name) in PHASES.items():
        total = sum(ct for (file, _, fn), (_, _, _, ct, _) in stats.items()
                    if fn == name and file.endswith(suffix))
        out[phase] = round(total, 2)
    return out


def profiled(args: list[str], cwd: Path, prof: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "ABLATE_CACHE_DIR": "off", "PYTHONHASHSEED": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "orchestrator", *args],
                   cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - t0, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="a grid compare_scale.py recorded (--keep DIR/t...)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    root = args.root.resolve()
    recorded = json.loads((root / "recorded.json").read_text())
    grid, wd = str(root / "grid.yaml"), root / "workdir"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")],
                   check=True, stdout=subprocess.DEVNULL)
    row: dict[str, Any] = {**recorded, "loadavg_before": _loadavg()}
    with tempfile.TemporaryDirectory(prefix="compare-profile-") as tmp:
        t = Path(tmp)
        (t / "empty").mkdir()
        row["local_wall_s"] = profiled(["compare", grid, "--workdir", str(wd), "--out",
                                        str(t / "out-local")], root, t / "local.prof")
        row["local"] = phases(t / "local.prof")
        with mlflow_server(wd / "mlflow.db", t / "server.log") as url:
            row["server_wall_s"] = profiled(["compare", grid, "--workdir", str(t / "empty"),
                                             "--tracking-uri", url, "--out", str(t / "out-server")],
                                            root, t / "server.prof")
        row["server"] = phases(t / "server.prof")
        shutil.rmtree(t / "out-local", ignore_errors=True)
    row["loadavg_after"] = _loadavg()
    emit({"benchmark": "compare_profile", "rows": [row]}, args.json)


if __name__ == "__main__":
    main()
