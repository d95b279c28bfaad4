"""Hostile command lines of issue #24, as a user meets them: each is one line naming the flag
or file and the fix, exit code 2, within seconds, with nothing created or changed; closed pipes
are no error at all. Real things throughout: a real unreachable port on 127.0.0.1, a real
closed pipe, a real missing database driver; only the absence of an installed extra is made
(``hidepkgs.py``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cliproc
import pytest
import relhelpers as H

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens on it here
NO_RAY = "127.0.0.1:1"


@pytest.fixture
def grid_file(isolated: Path) -> str:
    return str(H.one_trial_grid(isolated / "g.yaml", "hostile", steps=4))


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *, within: float = 15,
             expected_warnings: tuple[str, ...] = ()) -> str:
    return H.refused_in_one_line(capsys, argv, within=within, expected_warnings=expected_warnings)


def test_bad_output_directories_are_refused_before_anything_runs(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = isolated / "afile"
    afile.write_text("x")
    cases = {
        "": "--out '': an empty value (it is not the default)",
        str(afile): f"--out {afile}: {afile} is a file, not a directory",
        f"{afile}/sub": f"--out {afile}/sub: {afile} (on the way to it) is not a directory",
        "/proc/ablate-out": "--out /proc/ablate-out: /proc is not writable",
        str(isolated / ("o" * 300)): "--out " + str(isolated / ("o" * 60)),
    }
    for out, said in cases.items():
        err = _refused(capsys, ["compare", grid_file, "--out", out])
        assert err.startswith(f"error: {said[:80]}"), err
        assert "fix: give --out" in err, err
    # the same for every option: '' would silently mean the default (another store, workdir, ...)
    for argv in [["submit", grid_file, "--tracking-uri", ""], ["submit", grid_file, "--workdir", " "],
                 ["submit", grid_file, "--address", ""], ["resume", grid_file, "--trial", "",
                                                           "--pool", "sim-h100"]]:
        flag = next(a for a in argv if a.startswith("--") and argv[argv.index(a) + 1].strip() == "")
        assert _refused(capsys, argv).startswith(f"error: {flag} '': an empty value"), argv
    # submit: --out is only for --dry-run (the grid would run for real, the flag ignored)
    err = _refused(capsys, ["submit", grid_file, "--out", str(isolated / "manifests")])
    assert "only for --dry-run" in err and "fix: add --dry-run" in err, err
    assert afile.read_text() == "x" and not (isolated / ".ablate").exists()


def test_a_workdir_name_too_long_for_the_os_is_one_line_for_every_command(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    long = isolated / ("w" * 300)
    for argv in [["submit", grid_file], ["status"], ["cancel", "hostile"], ["compare", grid_file],
                 ["resume", grid_file, "--failed", "--pool", "sim-h100"], ["ui"],
                 ["run-trial", grid_file, "--trial", "t000000000000"]]:
        err = _refused(capsys, [*argv, "--workdir", str(long)])
        assert "has 300 bytes, over 255" in err and "shorter path" in err, (argv, err)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_summary_every_must_be_a_finite_positive_number(
    grid_file: str, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    err = _refused(capsys, ["submit", grid_file, f"--summary-every={value}"])
    assert err.startswith(f"error: --summary-every {float(value)}: must be > 0 seconds"), err


def test_tracking_stores_that_cannot_work_are_refused_before_ray_starts(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    file_store = f"file://{isolated}/mlruns"
    for argv in [["submit", grid_file], ["compare", grid_file], ["run-trial", grid_file,
                 "--trial", "t000000000000"], ["ui"]]:
        # MLflow 3 dies on a file store deep inside; the old fix message even recommended one
        err = _refused(capsys, [*argv, "--tracking-uri", file_store])
        assert "MLflow 3 no longer runs file stores" in err and "fix: use a SQLite store, e.g. "\
            f"sqlite:///{isolated}/mlflow.db" in err and "file:///DIR" not in err, err
        # a server that is down: one line at once (MLflow alone retried for minutes)
        err = _refused(capsys, [*argv, "--tracking-uri", CLOSED], within=15)
        assert "no MLflow server answers at 127.0.0.1:9 (Connection refused)" in err, err
    # a database server whose Python driver is not installed: named, password never shown
    err = _refused(capsys, ["submit", grid_file, "--tracking-uri",
                            "postgresql://me:hunter2@127.0.0.1:5/db"])
    assert "database driver" in err and "not installed; fix: pip install" in err, err
    assert "hunter2" not in err and "me:***@" in err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", CLOSED)  # the same by the environment
    assert "no MLflow server answers" in _refused(capsys, ["compare", grid_file])
    assert not (isolated / ".ablate" / "hostile").exists() and not (isolated / "mlruns").exists()


def test_compare_of_a_grid_that_never_ran_creates_no_store(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(capsys, ["compare", grid_file])
    assert err.startswith("error: grid 'hostile' has not run: there is no MLflow store at "), err
    assert f"fix: `ablate submit {grid_file}` first" in err
    assert "INFO" not in err and not (isolated / ".ablate").exists()


def test_an_unreachable_ray_address_is_refused_within_seconds(
    isolated: Path, grid_file: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    for address in (NO_RAY, f"ray://{NO_RAY}"):
        err = _refused(capsys, ["submit", grid_file, "--address", address])
        assert err.startswith(f"error: --address {address}: no Ray cluster answers at {NO_RAY} "
                              "(Connection refused); fix: start the cluster"), err
    assert "not HOST:PORT" in _refused(capsys, ["submit", grid_file, "--address", "nowhere"])
    err = _refused(capsys, ["submit", grid_file, "--address", f"ray://me:hunter2@{NO_RAY}"])
    assert f"ray://***@{NO_RAY}" in err and "hunter2" not in err, err
    monkeypatch.setenv("RAY_ADDRESS", NO_RAY)
    assert "$RAY_ADDRESS" in _refused(capsys, ["submit", grid_file])
    assert not (isolated / ".ablate" / "hostile").exists()


def test_k8s_without_a_cluster_is_an_error_not_pending_trials(
    isolated: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(isolated / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    err = _refused(capsys, ["submit", str(REPO / "grids" / "seed_study.yaml"), "--backend", "k8s",
                            "--force"], expected_warnings=("sglang is not installed",))
    assert "backend k8s: no Kubernetes credentials" in err and "KUBECONFIG" in err, err
    assert not (isolated / ".ablate").exists()


# --------------------------------------------------------------------------- subprocesses


def _ablate_without(packages: str, args: list[str], env: dict[str, str], cwd: Path
                    ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HERE / "hidepkgs.py"), packages, *args], env=env,
                          cwd=cwd, text=True, capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize(("packages", "args", "extra"), [
    ("verl,transformers,tokenizers,transfer_queue",
     ["plan", "grids/verl_cpu.yaml", "--show-overrides"], "verl"),
    ("kubernetes,kubernetes_validate",
     ["submit", "grids/seed_study.yaml", "--backend", "k8s", "--dry-run", "--force", "--out", "{tmp}/m"],
     "k8s"),
    ("kubernetes,kubernetes_validate",
     ["submit", "grids/seed_study.yaml", "--backend", "k8s", "--force"], "k8s"),
], ids=["plan-verl-overrides", "k8s-dry-run", "k8s-submit"])
def test_a_missing_extra_is_one_line_with_the_pip_command(
    tmp_path: Path, packages: str, args: list[str], extra: str
) -> None:
    with cliproc.ablate_env(tmp_path, {"ABLATE_K8S_IMAGE": "example.org/verl:1"}) as env:
        proc = _ablate_without(packages, [a.format(tmp=tmp_path) for a in args], env, REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    # A GPU grid planned here may also warn that its engine is not installed (the image has it).
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("warning: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"pip install -e '.[{extra}]'" in proc.stderr, proc.stderr
    assert not (tmp_path / "m").exists() and not (tmp_path / ".ablate").exists()


def test_plan_into_a_closed_pipe_is_no_error(tmp_path: Path) -> None:
    """`ablate plan grids/seed_study.yaml --show-overrides --limit 0 | head -3`."""
    with cliproc.ablate_env(tmp_path) as env:
        proc = subprocess.Popen(cliproc.command(["plan", "grids/seed_study.yaml", "--show-overrides",
                                                 "--limit", "0"]), env=env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        head = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # what `head -3` does after its third line
        err = proc.stderr.read()
        rc = proc.wait(timeout=120)
    assert "seed-study-4b" in head[0]
    errors = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
    assert rc == 0 and errors == [], err[-2000:]


@pytest.mark.slow
def test_submit_into_a_closed_pipe_runs_the_grid_to_its_end(tmp_path: Path) -> None:
    """`ablate submit GRID | head -1`: the reader leaves after one line; the orchestrator keeps
    running every trial to its verdict (it was killed mid-run by a BrokenPipeError) and ends
    with exit code 0, nothing on stderr but Ray's own notes."""
    from rayclusters import write_grid

    path = write_grid(tmp_path / "g.yaml", "piped", steps=12, pools=["sim-h100"], seeds=[0, 1],
                      levels=["none", "token"], budget="{max_parallel: 2}")
    with cliproc.ablate_env(tmp_path, {"ABLATE_DOUBLE_STEP_S": "0.1"}) as env:
        proc = subprocess.Popen(cliproc.command(["submit", str(path)], double=True), env=env,
                                cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # `head -1` is done
        err = proc.stderr.read()
        rc = proc.wait(timeout=600)
        status = cliproc.run(["status", "piped", "--json"], env, tmp_path, timeout=120)
    assert first.strip(), err[-2000:]
    assert rc == 0 and "Traceback" not in err and "BrokenPipe" not in err, err[-3000:]
    import json

    states = [t["state"] for t in json.loads(status.stdout)["trials"]]
    assert states == ["done"] * 4, status.stdout[-2000:]


def test_catalogue_and_set_values_are_refused_where_they_come_from(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A count is an integer (`capacity: true` was read as 1); a typo in a pool's sim_profile
    is the catalogue's, at its line (was `<grid>:1: axes ... exclude this combination`); a
    --set value a trial cannot run with is the flag's (was the grid's axes, "add an exclude:")."""
    from orchestrator.grid import expand, load_grid
    from orchestrator.scheduler._rescue import _derive

    catalog = isolated / "pools.yaml"
    grid = isolated / "cg.yaml"
    grid.write_text("name: cg\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 4\n"
                    f"pool_catalog: {catalog}\npool: sim-x\n")
    head = "pools:\n  sim-x:\n    kind: sim\n    accelerator: x\n"
    for body, said in [
        ("    capacity: true\n", f"{catalog}:5: pools.sim-x.capacity: Input should be a valid integer"),
        ("    nodes: 1.0\n", f"{catalog}:5: pools.sim-x.nodes: Input should be a valid integer"),
        ("    sim_profile: {rollout_dtyp: bf16}\n",
         f"{catalog}:5: pools.sim-x: sim_profile.rollout_dtyp is not a simulator knob"),
    ]:
        catalog.write_text(head + body)
        err = _refused(capsys, ["plan", str(grid)])
        assert said in err and "axes" not in err and "exclude" not in err, err
    good = isolated / "good-pools.yaml"  # another file: catalogues are cached by path
    good.write_text(head)
    grid.write_text(grid.read_text().replace(str(catalog), str(good)))
    g = load_grid(grid)
    (t,) = expand(g)
    for sets, said in [({"train.lr": -1.0}, "--set train.lr=-1.0: trial "),
                       ({"correction.is_bounds": [2.0, 0.5]}, "--set correction.is_bounds=[2.0, 0.5]: ")]:
        with pytest.raises(Exception, match="fix: change the --set value") as info:
            _derive(g, t, sets, "sim-x", 2)
        assert str(info.value).startswith(said) and "exclude" not in str(info.value), info.value
