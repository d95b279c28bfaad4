"""What ``tracking: {every: N}`` saves: MLflow store size and recording time per trial, and
whether compare still gives the same tables (issue 27).

For each N in ``--every`` it records the same grid (``compare_scale.grid_yaml``: T trials x
``--steps`` steps x ``--metrics`` metrics, generated values, 10% of trials collapsing) through
the runner, with ``tracking.every`` = N, into a fresh workdir and SQLite store. The N values
alternate ``--repeat`` times in this one process, so they share the load; the best (lowest)
time of each is quoted, with this process's CPU seconds. Then, on the first recording of each
N, it times ``ablate compare`` with the workdir and against a loopback ``mlflow server`` with
no workdir, and checks that every one of these compares wrote the same ``trials.csv`` numbers
and verdicts (``tables_agree``).

    python benchmarks/tracking_every.py --trials 40 --every 1 10 --json results/benchmarks/tracking_every.json
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_scale as C  # the sibling benchmark: its grid, recorder and timers


def _points(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        return int(con.execute("SELECT COUNT(*) FROM metrics").fetchone()[0])


def _tables(root: Path, out: str) -> Any:
    import pandas as pd

    return (pd.read_csv(root / out / "trials.csv")[list(C.TABLE_COLUMNS)].sort_values("trial_id")
            .reset_index(drop=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--metrics", type=int, default=40)
    p.add_argument("--every", type=int, nargs="+", default=[1, 10])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.trials <= 0 or args.trials % (4 * C.SEEDS):
        p.error(f"--trials {args.trials}: must be a positive multiple of {4 * C.SEEDS}")
    import numpy as np

    load_before = C._loadavg()
    runs: dict[int, list[tuple[float, float]]] = {e: [] for e in args.every}
    with tempfile.TemporaryDirectory(prefix="tracking-every-") as tmp:
        roots = {}
        for rep in range(args.repeat):
            for every in args.every:
                root = Path(tmp) / f"e{every}-r{rep}"
                root.mkdir()
                cpu0 = time.process_time()
                wall = C.record_grid(root, args.trials, args.steps, args.metrics, True, every)
                runs[every].append((wall, time.process_time() - cpu0))
                print(f"every={every} rep={rep}: {wall:.1f} s", file=sys.stderr, flush=True)
                if rep == 0:
                    roots[every] = root
                else:
                    shutil.rmtree(root)
        rows = []
        for every, root in roots.items():
            db = root / "workdir" / "mlflow.db"
            with C.mlflow_server(db, root / "server.log") as url:
                timed = C.time_commands(C.REPO, root, url, args.timeout)
            best = min(runs[every])
            rows.append({"every": every, "record_s_per_trial": round(best[0] / args.trials, 3),
                         "record_cpu_s_per_trial": round(best[1] / args.trials, 3),
                         "record_s_all": [round(w, 1) for w, _ in runs[every]],
                         "store_mb_per_trial": round(C._size_mb(db) / args.trials, 2),
                         "mlflow_points_per_trial": _points(db) // args.trials,
                         "workdir_mb_per_trial": round(C._size_mb(root / "workdir" / C.GRID_NAME) / args.trials, 2),
                         **timed})
        frames = [_tables(root, o) for root in roots.values() for o in ("out-local", "out-server")]
        ref = frames[0]
        nums = [c for c in C.TABLE_COLUMNS if c not in ("trial_id", "verdict")]
        agree = all(f["trial_id"].equals(ref["trial_id"]) and f["verdict"].equals(ref["verdict"])
                    and bool(np.allclose(f[nums].to_numpy(float), ref[nums].to_numpy(float), rtol=1e-12,
                                         atol=0, equal_nan=True)) for f in frames[1:])
    out = {"benchmark": "tracking_every", "trials": args.trials, "steps": args.steps,
           "metrics": args.metrics, "repeat": args.repeat, "code": C._code_label(C.REPO),
           "loadavg_before": load_before, "rows": rows, "tables_agree": agree,
           "loadavg_after": C._loadavg()}
    C.emit(out, args.json)


if __name__ == "__main__":
    main()
