"""Credentials in the environment never reach MLflow, the workdir or the logs.

``ablate submit`` runs as a subprocess on the embedded local Ray (so its Ray workers inherit the
environment too) with recognisable values in the variables a GPU lab really has set
(AWS, MLflow, Hugging Face, W&B, GitHub, a database URL with a password). Afterwards every byte
under the workdir (MLflow's SQLite store and artifact store, trial records, checkpoints, Ray Tune's
experiment directory), every file under the private Ray temp dir (driver, raylet and worker
logs), and the captured stdout/stderr of submit, status and env are searched for each value;
MLflow is also read through its API (params, tags, metric names, artifacts of every run).
"""

from __future__ import annotations

import json
from pathlib import Path

import cliproc
import pytest

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAREL10CANARYKEYID",
    "AWS_SECRET_ACCESS_KEY": "rel10-aws-secret-5b9d2c7e1f",
    "AWS_SESSION_TOKEN": "rel10-aws-session-7c1e0a",
    "MLFLOW_TRACKING_TOKEN": "rel10-mlflow-token-33f8a1",
    "MLFLOW_TRACKING_PASSWORD": "rel10-mlflow-password-c0ffee",
    "HF_TOKEN": "hf_rel10HuggingFaceCanary0042",
    "HUGGING_FACE_HUB_TOKEN": "hf_rel10HubCanary0043",
    "WANDB_API_KEY": "rel10wandbcanary0000000000000000000000044",
    "GITHUB_TOKEN": "ghp_rel10GithubCanary000000000000000045",
    "DATABASE_URL": "postgresql://ablate:rel10-db-password-46@db.internal/mlflow",
}
GRID = """\
name: secrets
recipe: sim/grpo_tiny
backend: sim
steps: 6
seeds: [0]
axes:
  correction.is_level: [token, sequence]
  pool: [sim-h100]
checkpoint: {every: 3}
budget: {max_parallel: 2}
overrides:
  train.prompts_per_step: 4
  train.group_size: 4
  train.minibatches: 1
  eval.every: 3
  eval.prompts: 16
  model.d_model: 32
  model.n_layers: 1
  model.d_ff: 64
"""


def _needles() -> dict[str, bytes]:
    out = {k: v.encode() for k, v in SECRETS.items()}
    out["DATABASE_URL password"] = b"rel10-db-password-46"
    return out


def _scan_tree(root: Path) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                data = p.read_bytes()
            except OSError:
                continue
            hits += [f"{name} in {p}" for name, n in _needles().items() if n in data]
    return hits




@pytest.fixture(scope="module")
def leaks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Run a tiny grid with the secrets set; the hits of each scan (empty: nothing leaked)."""
    root = tmp_path_factory.mktemp("secrets")
    (root / "g.yaml").write_text(GRID)
    with cliproc.ablate_env(root, SECRETS) as env:
        ray_tmp = Path(env["RAY_TMPDIR"])
        submit = cliproc.run(["submit", "g.yaml", "--json"], env, root, timeout=400)
        assert submit.returncode == 0, submit.stderr[-3000:]
        summary = json.loads(submit.stdout.strip().splitlines()[-1])
        assert summary["states"] == {"done": 2}, summary["failed"]
        status = cliproc.run(["status", "secrets", "--json"], env, root, timeout=120)
        # A tracking URI and a Ray address with credentials in them: `ablate env` redacts both.
        env_uri = {
            **env,
            "MLFLOW_TRACKING_URI": f"http://u:{SECRETS['MLFLOW_TRACKING_PASSWORD']}@h:1",
            "RAY_ADDRESS": f"ray://u:{SECRETS['AWS_SECRET_ACCESS_KEY']}@h:10001",
        }
        envcmd = cliproc.run(["env", "--json"], env_uri, root, timeout=120)
        assert status.returncode == 0 and envcmd.returncode == 0, status.stderr + envcmd.stderr
        captured = {
            "submit": submit.stdout + submit.stderr,
            "status": status.stdout + status.stderr,
            "env": envcmd.stdout + envcmd.stderr,
        }
        out = {
            "output": [
                f"{name} in {what} output"
                for what, text in captured.items()
                for name, n in _needles().items()
                if n.decode() in text
            ],
            "workdir": _scan_tree(root),
            "mlflow": _scan_mlflow(summary["tracking_uri"], root / "dl"),
            "ray_logs": _scan_tree(ray_tmp),
        }
        files = sum(1 for p in root.rglob("*") if p.is_file()) + sum(
            1 for p in ray_tmp.rglob("*") if p.is_file()
        )
        assert files > 50  # the scans saw the stores and the logs, not an empty tree
        print(f"secrets: {len(SECRETS)} values, {files} files scanned: {out}")
        return out


@pytest.mark.slow
def test_credentials_never_reach_mlflow_the_workdir_or_the_output(
    leaks: dict[str, list[str]],
) -> None:
    assert leaks["mlflow"] == [] and leaks["workdir"] == [] and leaks["output"] == []


@pytest.mark.slow
def test_credentials_never_reach_ray_logs(
    leaks: dict[str, list[str]],
) -> None:
    # Not even the AWS variables Ray Tune copies into every trainable's runtime_env by default
    # (orchestrator/scheduler/_tune.py stops that propagation; Ray logs runtime_envs in plain text).
    assert leaks["ray_logs"] == [], leaks["ray_logs"]


def _scan_mlflow(uri: str, dl: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    mlc = MlflowClient(uri)
    hits, runs = [], 0
    for exp in mlc.search_experiments():
        texts = [json.dumps(exp.tags)]
        for run in mlc.search_runs([exp.experiment_id]):
            runs += 1
            d = run.data
            texts.append(json.dumps([run.info.run_name, d.params, d.tags, sorted(d.metrics)]))
            local = Path(mlc.download_artifacts(run.info.run_id, "", str(dl / run.info.run_id)))
            texts += [
                p.read_bytes().decode("utf-8", "replace") for p in local.rglob("*") if p.is_file()
            ]
        hits += [
            f"{name} in MLflow experiment {exp.name}"
            for name, n in _needles().items()
            for t in texts
            if n.decode() in t
        ]
    assert runs >= 3  # the parent and both trials
    return hits
