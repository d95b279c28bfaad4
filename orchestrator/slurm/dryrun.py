"""``ablate submit GRID --backend slurm --dry-run --out DIR``: every trial's job script (its
first attempt), for inspection; nothing is submitted and no cluster is asked.

Layout: ``<out>/jobs/<trial_id>.sbatch`` and ``<out>/index.json``. A script's job directory is
where ``ablate submit`` would put it under the workdir (``--workdir``/``ABLATE_WORKDIR``); its
``job.json`` (the trial, its config and pool) is written there only by a real submission.
"""
from __future__ import annotations

from orchestrator.backends import backend
from orchestrator.grid import expand, load_grid
from orchestrator.slurm.script import job_name, script_text
from orchestrator.store import TrialPaths, workspace


def dry_run(grid_path: str, out_dir: str | None = None, force: bool = False,
            workdir: str | None = None, backend_name: str = "slurm") -> int:
    grid = load_grid(grid_path, backend=backend_name, limit_trials=not force)
    trials = expand(grid, force=force)
    out, jobs = workspace.dry_run_dir(out_dir, default=f"slurm-dry-run/{grid.name}",
                                      files="jobs", pattern="t*.sbatch")
    grid_dir = workspace.grid_dir(grid.name, workdir)
    index = []
    slurm = backend(grid.backend)
    for trial in trials:
        pool = grid.pools.pools[trial.pool]
        log_dir = TrialPaths(grid_dir, trial.trial_id).root / "logs"
        job_dir = log_dir / "slurm-attempt-1"
        trainer = slurm.trainer(pool)
        text = script_text(trainer, grid.trial_config(trial), pool, job_dir,
                           job_name(trial.trial_id, log_dir))
        (jobs / f"{trial.trial_id}.sbatch").write_text(text, encoding="utf-8")
        index.append({"trial_id": trial.trial_id, "pool": trial.pool, "seed": trial.seed,
                      "axes": dict(trial.axes), "file": f"jobs/{trial.trial_id}.sbatch",
                      "runs": f"{trainer.__module__}.{trainer.__qualname__}",
                      "sbatch": ["sbatch", f"--output={job_dir}/slurm-%j.out",
                                 f"jobs/{trial.trial_id}.sbatch"]})
    workspace.write_dry_run_index(out, grid.name, index)
    pools = sorted({t.pool for t in trials})
    print(f"wrote {len(index)} Slurm job script(s) for grid {grid.name!r} on pool(s) "
          f"{', '.join(pools)} to {out}")
    return 0
