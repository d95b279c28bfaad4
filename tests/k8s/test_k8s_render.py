"""RayJob rendering: every trial of the example GPU grids validates, is pinned to its pool, and
carries the verl job unchanged and inert."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8shelpers import GPU_GRIDS, IMAGE, REPO, loaded, rendered, settings
from k8svalidate import ManifestInvalid, crd_dir, load_all, validate

from orchestrator.exceptions import UserError
from orchestrator.k8s import names
from orchestrator.k8s.render import render_rayjob
from orchestrator.pools import load_catalog
from orchestrator.verl.topology import world_size
from orchestrator.verl.trainer import VerlTrainer

EXPECTED_TRIALS = {"grids/seed_study.yaml": 209, "grids/seed_study_14b.yaml": 160}


def test_every_trial_of_the_gpu_grids_validates(gpu_grid: str) -> None:
    jobs = rendered(gpu_grid)
    assert len(jobs) == EXPECTED_TRIALS[gpu_grid]
    checks: dict[str, int] = {}
    for _, job in jobs:
        for c in validate(job):
            checks[c] = checks.get(c, 0) + 1
    assert checks["compact"] == len(jobs)
    assert checks.get("official-crd", 0) == (len(jobs) if crd_dir() else 0)
    # Names are unique per trial and attempt, and fit KubeRay's limit.
    assert len({j["metadata"]["name"] for _, j in jobs}) == len(jobs)


@pytest.mark.skipif(
    not crd_dir(),
    reason="set ABLATE_CRD_DIR to a directory with the official "
    "KubeRay v1 and Kueue v1beta2 CRD YAML files to validate against them",
)
def test_official_crds_reject_what_we_must_not_send() -> None:
    _, job = rendered(GPU_GRIDS[0])[0]
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 1  # typo: would be pruned
    with pytest.raises(ManifestInvalid, match="compact schema"):
        validate(bad)
    from k8svalidate import official_validator

    errors = list(official_validator("ray.io/v1", "RayJob").iter_errors(bad))
    assert any("replica" in e.message for e in errors)


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda j: j["spec"].__setitem__("submissionMode", "ShellMode"), "submissionMode"),
        (
            lambda j: j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("minReplicas"),
            "minReplicas",
        ),
        (lambda j: j["metadata"].__setitem__("name", "x" * 48), "name"),
        (
            lambda j: j["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
                "containers"
            ][0].__setitem__("imagePullPolicy", 3),
            "imagePullPolicy",
        ),
        (lambda j: j["spec"].__setitem__("entrypointt", "x"), "entrypointt"),
    ],
)
def test_compact_schema_catches_mistakes(mutate, needle: str) -> None:
    _, job = rendered(GPU_GRIDS[0])[0]
    bad = copy.deepcopy(job)
    mutate(bad)
    with pytest.raises(ManifestInvalid) as exc:
        validate(bad)
    assert (
        needle in str(exc.value)
        or "does not match" in str(exc.value)
        or "too long" in str(exc.value)
    )


def _worker(job: dict) -> dict:
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def test_workers_are_pinned_to_the_trial_pool_only(gpu_grid: str) -> None:
    grid, _ = loaded(gpu_grid)
    seen_nodes = set()
    for trial, job in rendered(gpu_grid):
        pool = grid.pools.pools[trial.pool]
        group = _worker(job)
        spec = group["template"]["spec"]
        assert spec["nodeSelector"] == pool.node_labels
        assert "affinity" not in spec  # no OR over other GPU types
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        (ctr,) = spec["containers"]
        gpus = str(pool.gpus_per_node)
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert ctr["resources"]["requests"] == ctr["resources"]["limits"]
        nodes = world_size(pool, grid.trial_config(trial)) // pool.gpus_per_node  # recipe nnodes
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == nodes
        seen_nodes.add(nodes)
        assert group["labels"] == {"ray.io/accelerator-type": pool.ray_accelerator_type}
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert "nvidia.com/gpu" not in head["containers"][0]["resources"]["limits"]
        labels = job["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "ablate-trials"
        assert (
            labels["ablate.io/trial"],
            labels["ablate.io/pool"],
            labels["ablate.io/attempt"],
        ) == (trial.trial_id, trial.pool, "1")
        assert labels["ablate.io/grid"] == trial.grid
        assert job["spec"]["shutdownAfterJobFinishes"] is True
        assert job["spec"]["backoffLimit"] == 0
    # The 4B recipe runs on one node, the 14B recipe on two (trainer.nnodes).
    assert seen_nodes == ({1} if "14b" not in gpu_grid else {2})


def test_the_job_is_the_verl_job(gpu_grid: str) -> None:
    """k8s delegates to VerlTrainer: same argv, same trial ids, env with the trial's paths."""
    from orchestrator.backends import backend

    assert backend("k8s").identity() == backend("verl").identity()
    grid, trials = loaded(gpu_grid)
    s = settings()
    for trial, job in rendered(gpu_grid)[:25]:
        argv = VerlTrainer.command(
            trial,
            grid.trial_config(trial),
            checkpoint_dir=s.checkpoint_dir(trial.grid, trial.trial_id),
        )
        assert shlex.split(job["spec"]["entrypoint"]) == argv
        env = {e["name"]: e for e in _worker(job)["template"]["spec"]["containers"][0]["env"]}
        assert env["MLFLOW_TRACKING_URI"]["value"] == s.tracking_uri
        assert env["VERL_FILE_LOGGER_ROOT"]["value"] == s.metrics_root(
            trial.grid, trial.trial_id, 1
        )
        assert "MLFLOW_RUN_ID" not in env  # no run yet in a dry run
        assert env["HF_TOKEN"] == {
            "name": "HF_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": "ablate-hf-token", "key": "token", "optional": True}
            },
        }
    # verl writes <root>/<project=grid>/<experiment=trial>.jsonl: the path the backend tails.
    t = trials[0]
    assert s.metrics_path(t.grid, t.trial_id, 2) == (
        f"{s.metrics_root(t.grid, t.trial_id, 2)}/{t.grid}/{t.trial_id}.jsonl"
    )


def test_plan_shows_the_verl_overrides_each_rayjob_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``ablate plan --backend k8s --show-overrides``: the job's verl override list, as for verl."""
    from orchestrator.cli import main

    monkeypatch.setenv("ABLATE_WORKDIR", str(tmp_path))
    grid_file = str(REPO / GPU_GRIDS[0])
    shown = []
    for backend in ("verl", "k8s"):
        assert main(["plan", grid_file, "--backend", backend, "--show-overrides", "--limit", "1"]) == 0
        out = capsys.readouterr().out
        shown.append([ln.strip() for ln in out.splitlines() if ln.startswith("  ") and "=" in ln])
    assert shown[0] == shown[1] and any(
        ln.startswith("algorithm.rollout_correction.") for ln in shown[1]), shown


def test_run_id_and_resume_path_reach_the_job() -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    t = trials[0]
    s = settings()
    resume = f"{s.checkpoint_dir(t.grid, t.trial_id)}/global_step_50"
    job = render_rayjob(
        t,
        grid.trial_config(t),
        grid.pools.pools[t.pool],
        settings=s,
        attempt=3,
        run_id="0123abcd",
        resume_path=resume,
    )
    validate(job)
    env = {
        e["name"]: e.get("value") for e in _worker(job)["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MLFLOW_RUN_ID"] == "0123abcd"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert f"trainer.resume_from_path='{resume}'" in argv
    assert (
        job["metadata"]["name"].endswith("-a3")
        and job["metadata"]["labels"]["ablate.io/attempt"] == "3"
    )


def test_fallback_only_for_an_explicit_resume_and_same_shape() -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    t = next(x for x in trials if x.pool == "h20")
    pools = grid.pools.pools
    cfg = grid.trial_config(t)
    s = settings()
    with pytest.raises(UserError, match="only allowed for an explicit `ablate resume --pool`"):
        render_rayjob(t, cfg, pools["h20"], settings=s, fallback_pools=[pools["h100"]])
    resume = f"{s.checkpoint_dir(t.grid, t.trial_id)}/global_step_25"
    job = render_rayjob(
        t,
        cfg,
        pools["h20"],
        settings=s,
        attempt=2,
        resume_path=resume,
        fallback_pools=[pools["h100"]],
    )
    validate(job)
    spec = _worker(job)["template"]["spec"]
    assert "nodeSelector" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [t_["matchExpressions"][0]["values"] for t_ in terms] == [
        ["NVIDIA-H20"],
        ["NVIDIA-H100-80GB-HBM3"],
    ]
    assert job["metadata"]["annotations"]["ablate.io/fallback-pools"] == "h100"
    # A pool of another shape would not load verl's world-size-keyed shards.
    small = pools["h100"].model_copy(update={"name": "h100x4", "gpus_per_node": 4})
    with pytest.raises(UserError, match="same shape"):
        render_rayjob(t, cfg, pools["h20"], settings=s, resume_path=resume, fallback_pools=[small])


def test_trial_cannot_be_rendered_on_another_pool() -> None:
    grid, trials = loaded(GPU_GRIDS[0])
    t = next(x for x in trials if x.pool == "h20")
    with pytest.raises(UserError, match="pinned to pool 'h20'"):
        render_rayjob(t, grid.trial_config(t), grid.pools.pools["h100"], settings=settings())


def test_missing_image_is_a_one_line_error() -> None:
    from orchestrator.k8s.settings import ClusterSettings

    grid, trials = loaded(GPU_GRIDS[0])
    t = trials[0]
    with pytest.raises(UserError) as exc:
        render_rayjob(
            t, grid.trial_config(t), grid.pools.pools[t.pool], settings=ClusterSettings()
        )
    assert f"pools.{t.pool}.images.sglang: not set" in str(exc.value) and "ABLATE_K8S_IMAGE" in str(
        exc.value
    )


def test_each_engine_gets_its_pools_image() -> None:
    """A pool names an image per rollout engine; the trial's engine (rollout.engine, else the
    recipe's) picks it, in the RayJob's head, workers and submitter alike."""
    from orchestrator.k8s.settings import ClusterSettings

    grid, trials = loaded(GPU_GRIDS[0])
    t = trials[0]
    pool = grid.pools.pools[t.pool].model_copy(
        update={"images": {"sglang": "reg/verl-sglang:0.9.1", "vllm": "reg/verl-vllm:0.9.1"}})
    for engine in ("sglang", "vllm"):
        config = grid.trial_config(t).updated({"rollout": {"engine": engine}})
        job = render_rayjob(t, config, pool, settings=ClusterSettings())
        images = {c["image"] for c in _containers(job)}
        assert images == {f"reg/verl-{engine}:0.9.1"}, images
    only_sglang = pool.model_copy(update={"images": {"sglang": "reg/verl-sglang:0.9.1"}})
    with pytest.raises(UserError, match=r"images\.vllm: not set"):
        render_rayjob(t, grid.trial_config(t).updated({"rollout": {"engine": "vllm"}}), only_sglang,
                      settings=ClusterSettings())


def _containers(job: dict) -> list[dict]:
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], spec["submitterPodTemplate"],
                 *(g["template"] for g in cluster.get("workerGroupSpecs", []))]
    return [c for tpl in templates for c in tpl["spec"]["containers"]]


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"ABLATE_K8S_NAMESPACE": "Ablate_NS"}, "namespace"),
        ({"ABLATE_K8S_QUEUE": "q" * 64}, "LocalQueue"),
        ({"ABLATE_K8S_CHECKPOINT_ROOT": "relative/path"}, "absolute"),
    ],
)
def test_bad_settings_are_one_line_errors(env: dict, needle: str) -> None:
    from orchestrator.k8s.settings import ClusterSettings

    with pytest.raises(UserError) as exc:
        ClusterSettings.from_env(env)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# --------------------------------------------------------------------------- injection

EVIL = [
    "$(touch {p}/PWNED1)",
    "`touch {p}/PWNED2`",
    "x; touch {p}/PWNED3",
    "a' ; touch {p}/PWNED4 #",
    "| touch {p}/PWNED5",
    "&& touch {p}/PWNED6",
    '"$(touch {p}/PWNED7)"',
    "line\ntouch {p}/PWNED8",
]


def _evil_grid(tmp_path: Path) -> Path:
    values = [v.format(p=tmp_path) for v in EVIL]
    grid = {
        "name": "evil-grid",
        "recipe": "verl/qwen3_4b_dapo",
        "backend": "k8s",
        "steps": 10,
        "pool": "h100",
        "axes": {"data.train_files": values},
    }
    path = tmp_path / "grids" / "evil.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(grid))
    return path


DUMP = "import json,sys; print(json.dumps(sys.argv[1:]))"


def test_shell_metacharacters_in_grid_values_stay_inert(tmp_path: Path, monkeypatch) -> None:
    """The entrypoint goes through two shells (KubeRay's `bash -c`, then Ray's job supervisor
    on `shlex.join` of what bash produced); both must give back exactly verl's argv."""
    from orchestrator.grid import expand, load_grid

    monkeypatch.setenv("ABLATE_RECIPES", str(REPO / "recipes"))
    grid = load_grid(_evil_grid(tmp_path))
    trials = expand(grid)
    assert len(trials) == len(EVIL)
    for t in trials:
        job = render_rayjob(t, grid.trial_config(t), grid.pools.pools[t.pool], settings=settings())
        validate(job)
        entry = job["spec"]["entrypoint"]
        argv = shlex.split(entry)
        # Replace the program by an argv dumper; keep every argument byte for byte.
        probe = shlex.join([sys.executable, "-c", DUMP]) + " " + entry.split(" ", 3)[3]
        first = json.loads(
            subprocess.run(
                ["bash", "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
            ).stdout
        )
        assert first == argv[3:]
        again = shlex.join([sys.executable, "-c", DUMP, *first])
        second = json.loads(
            subprocess.run(
                ["sh", "-c", again], capture_output=True, text=True, check=True, cwd=tmp_path
            ).stdout
        )
        assert second == argv[3:]
        assert any(a.startswith("data.train_files=") for a in second)
    assert not list(tmp_path.glob("PWNED*"))


# --------------------------------------------------------------------------- dry run


def test_dry_run_writes_every_manifest(tmp_path: Path, monkeypatch, capsys) -> None:
    from orchestrator.cli import main

    monkeypatch.setenv("ABLATE_K8S_IMAGE", IMAGE)
    out = tmp_path / "out"
    (out / "rayjobs").mkdir(parents=True)
    (out / "rayjobs" / "ab-stale-t0-a1.yaml").write_text("stale")
    (out / "rayjobs" / "keep-me.txt").write_text("user file")
    code = main(
        ["submit", str(REPO / GPU_GRIDS[1]), "--backend", "k8s", "--dry-run", "--out", str(out)]
    )
    assert code in (0, None)
    files = sorted((out / "rayjobs").glob("ab-*.yaml"))
    assert len(files) == EXPECTED_TRIALS[GPU_GRIDS[1]]
    assert (out / "rayjobs" / "keep-me.txt").exists()
    n = 0
    for f in files:
        (obj,) = load_all(f.read_text())
        validate(obj)
        n += 1
    for f in ("kueue.yaml", "control-rayjob.yaml"):
        for obj in load_all((out / f).read_text()):
            validate(obj)
            n += 1
    index = json.loads((out / "index.json").read_text())
    assert len(index["trials"]) == len(files)
    assert "wrote 160 RayJob manifest(s)" in capsys.readouterr().out
    assert n == 160 + 1 + 1 + 4 + 1 + 1  # trials, control, cpu flavor, 4 GPU flavors, CQ, LQ


def test_dry_run_without_image_exits_2_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from orchestrator.cli import main

    monkeypatch.delenv("ABLATE_K8S_IMAGE", raising=False)
    code = main(
        [
            "submit",
            str(REPO / GPU_GRIDS[0]),
            "--backend",
            "k8s",
            "--dry-run",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "ABLATE_K8S_IMAGE" in err


def test_kueue_manifests_in_k8s_base_match_the_catalogue() -> None:
    from orchestrator.k8s.queues import HEADER, dump, render_kueue
    from orchestrator.k8s.settings import ClusterSettings

    want = dump(render_kueue(load_catalog(), ClusterSettings()), HEADER)
    assert (REPO / "k8s" / "base" / "kueue.yaml").read_text() == want, (
        "regenerate: python -m orchestrator.k8s.queues > k8s/base/kueue.yaml"
    )


def test_kueue_quota_and_no_flavor_fallback() -> None:
    from orchestrator.k8s.queues import render_kueue
    from orchestrator.k8s.settings import ClusterSettings

    cat = load_catalog()
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_kueue(cat, ClusterSettings())}
    for pool in (p for p in cat.pools.values() if p.kind == "gpu"):
        rf = objs[("ResourceFlavor", pool.kueue_flavor)]
        assert rf["spec"]["nodeLabels"] == pool.node_labels
        assert rf["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    cq = objs[("ClusterQueue", "ablate")]["spec"]
    assert cq["flavorFungibility"] == {
        "whenCanBorrow": "MayStopSearch",
        "whenCanPreempt": "MayStopSearch",
    }
    gpu_group = next(
        g for g in cq["resourceGroups"] if g["coveredResources"] == ["nvidia.com/gpu"]
    )
    quotas = {f["name"]: f["resources"][0]["nominalQuota"] for f in gpu_group["flavors"]}
    assert quotas == {"gpu-a100": 32, "gpu-h100": 32, "gpu-h20": 32, "gpu-l20": 32}  # 4 x 1 x 8
    assert objs[("LocalQueue", "ablate-trials")]["spec"] == {"clusterQueue": "ablate"}


def test_names_in_rendered_objects_follow_the_rules(gpu_grid: str) -> None:
    for _, job in rendered(gpu_grid):
        for k, v in job["metadata"]["labels"].items():
            names.check_label_key(k, "label")
            names.check_label_value(v, "label")
        names.check_dns_label(job["metadata"]["name"], "RayJob", max_len=47, dns1035=True)


def test_secrets_never_travel_as_values() -> None:
    """A job environment that carries a secret value is refused, not rendered."""
    grid, trials = loaded(GPU_GRIDS[0])
    t = trials[0]

    class Leaky:
        engine, world_size = "sglang", grid.pools.pools[t.pool].world_size

        def command(self, *a, **kw):
            return ["python", "-c", "pass"]

        def environment(self, trial, **kw):
            return {"HF_TOKEN": "hf_live_value"}

    with pytest.raises(UserError, match="HF_TOKEN looks like a secret"):
        render_rayjob(
            t, grid.trial_config(t), grid.pools.pools[t.pool], settings=settings(), job=Leaky()
        )
    _, job = rendered(GPU_GRIDS[0])[0]
    text = json.dumps(job)
    for e in (
        c
        for p in ("headGroupSpec",)
        for c in job["spec"]["rayClusterSpec"][p]["template"]["spec"]["containers"][0]["env"]
    ):
        if e["name"] in ("HF_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME"):
            assert "value" not in e and "secretKeyRef" in e["valueFrom"]
    assert "hf_live_value" not in text


def test_k8s_and_verl_trial_ids_agree(gpu_grid: str) -> None:
    from orchestrator.grid import expand, load_grid

    _, k8s_trials = loaded(gpu_grid)
    verl_trials = expand(load_grid(REPO / gpu_grid, backend="verl"))
    assert [t.trial_id for t in k8s_trials] == [t.trial_id for t in verl_trials]


K8S_BAD = Path(__file__).parents[1] / "data" / "k8s_bad_catalogs"


@pytest.mark.parametrize(("catalog", "needle"), [
    ("no_cpus_memory", "gpus_per_node, cpus_per_node and memory_per_node must be set"),
    ("bad_image", "image 'repo img' contains whitespace"),
    ("bad_flavor", "kueue_flavor 'Bad_Flavor' is not a valid Kubernetes DNS-1123 subdomain"),
    ("bad_label", "is not a valid Kubernetes label key"),
    ("bad_memory", "pools.gpu-x.memory_per_node '1.5Ti' is not a memory quantity"),
])
def test_plan_refuses_what_the_dry_run_refuses(tmp_path: Path, monkeypatch, capsys,
                                                 catalog: str, needle: str) -> None:
    """`ablate plan` of a k8s grid runs the pool checks the dry run runs (node labels, Kueue
    flavour, CPUs and memory, the image's form): the same one line, exit 2, from either."""
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_K8S_IMAGE", IMAGE)
    grid = tmp_path / "k.yaml"
    grid.write_text(f"name: k\nrecipe: verl/qwen3_4b_dapo\nbackend: k8s\nsteps: 2\npool: gpu-x\n"
                    f"pool_catalog: {K8S_BAD / (catalog + '.yaml')}\n")
    for argv in (["plan", str(grid)], ["submit", str(grid), "--dry-run", "--out", "o"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        errors = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
        assert len(errors) == 1 and needle in errors[0], (argv, err)
    assert not (tmp_path / "o").exists()


def test_a_rescue_pool_is_checked_at_plan_and_queued_by_the_dry_run(tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """A rescue runs on its entry's pool: that pool gets the plan-time checks of a trial's (a
    bad image refused before anything starts, not on the weekend the rescue fires), and the dry
    run's kueue.yaml holds its ResourceFlavor, or the rescue's RayJob would wait on a queue
    nobody created."""
    from orchestrator.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_K8S_IMAGE", IMAGE)
    grid = tmp_path / "k.yaml"
    head = "name: k\nrecipe: verl/qwen3_4b_dapo\nbackend: k8s\nsteps: 2\npool: h100\n"
    grid.write_text(head + f"pool_catalog: {K8S_BAD / 'bad_image.yaml'}\n"
                    "rescue:\n  - {when: collapsed, resume: {pool: gpu-x}}\n")
    for argv in (["plan", str(grid)], ["submit", str(grid), "--dry-run", "--out", "o"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        errors = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
        assert len(errors) == 1 and "image 'repo img' contains whitespace" in errors[0], err
    assert not (tmp_path / "o").exists()
    grid.write_text(head + "rescue:\n  - {when: collapsed, resume: {pool: h20}}\n")
    assert main(["submit", str(grid), "--dry-run", "--out", "o"]) == 0
    assert "rescue pool(s) h20" in capsys.readouterr().out
    objs = list(load_all((tmp_path / "o" / "kueue.yaml").read_text()))
    for obj in objs:
        validate(obj)
    flavors = {o["metadata"]["name"] for o in objs if o["kind"] == "ResourceFlavor"}
    assert any("h20" in f for f in flavors) and any("h100" in f for f in flavors), flavors
    assert len(list((tmp_path / "o" / "rayjobs").glob("ab-*.yaml"))) == 1  # the trial's only


@pytest.mark.parametrize(("field", "value"), [("head_memory", "16GB"), ("shm_size", "0Gi"),
                                              ("head_cpu", "4.5"), ("submitter_cpu", "half")])
def test_cluster_settings_quantities_are_checked_where_they_are_made(field: str,
                                                                     value: str) -> None:
    """A cluster setting every manifest carries is a Kubernetes quantity when the settings are
    built (plan and submit build them), not first when the API server rejects a RayJob."""
    from orchestrator.exceptions import UserError
    from orchestrator.k8s.settings import ClusterSettings

    with pytest.raises(UserError, match=f"cluster setting {field} '{value}' is not a"):
        ClusterSettings(**{field: value})
