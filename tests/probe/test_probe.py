"""``ablate probe`` on the simulator: its k3 is the committed quickstart trials' step-1 k3, the
committed probe is what the code produces, the attribution ranks sim-a100's causes, a gate over
its bound exits 1, bad input exits 2 before anything runs, and a second probe runs nothing.

One probe of grids/quickstart.yaml with --attribute (module fixture, ~10 s on 2 shared cores)
serves every test; the CLI tests reuse its workdir, so they read the cache (~1 s each).
"""
from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path

import pytest

from orchestrator import metrics as M
from orchestrator.cli import main
from orchestrator.grid import expand, load_grid
from orchestrator.probe import ProbeReport, probe
from orchestrator.probe._report import TIME_COLUMNS
from orchestrator.store import probe_ledger

REPO = Path(__file__).resolve().parents[2]
GRID = "grids/quickstart.yaml"
COMMITTED = REPO / "results" / "quickstart"


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProbeReport, Path]:
    root = tmp_path_factory.mktemp("probe")
    here = os.getcwd()
    os.chdir(REPO)  # the grid path as the committed files name it
    try:
        report = probe(GRID, attribute=True, workdir=str(root / "wd"), out=str(root / "out"),
                       track=False)
    finally:
        os.chdir(here)
    return report, root


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in csv.DictReader(fh)]


def test_the_committed_probe_is_what_the_code_produces(probed) -> None:
    _, root = probed
    out = root / "out"
    assert _rows(out / "probe.csv") == _rows(COMMITTED / "probe.csv")
    assert _rows(out / "probe_attribution.csv") == _rows(COMMITTED / "probe_attribution.csv")

    def text(p: Path) -> list[str]:
        return [line for line in p.read_text().splitlines() if not line.startswith("- time")]

    assert text(out / "probe.md") == text(COMMITTED / "probe.md")
    assert "does not predict mismatch that grows during training" in (out / "probe.md").read_text()


def test_probe_k3_is_the_committed_trials_step_1_k3_within_its_interval(probed) -> None:
    from orchestrator.sim import probe as sim_probe
    from orchestrator.sim.config import build_setup

    report, _ = probed
    grid = load_grid(REPO / GRID)
    with (COMMITTED / "trials.csv").open() as fh:
        committed = {r["trial_id"]: r for r in csv.DictReader(fh)}
    trials = {t.trial_id: t for t in expand(grid)}
    assert set(committed) == set(trials)  # the committed trials are this grid's
    for s in report.summaries:
        pool = s.measured.config.pool.name
        ids = [tid for tid, r in committed.items() if r["pool"] == pool]
        assert sorted(ids) == sorted(s.measured.config.trials)
        step1 = {}
        for tid in ids:  # step 1 of each committed trial, as it trained (pinned numerics)
            t = trials[tid]
            trainer = sim_probe.build(build_setup(grid.trial_config(t), grid.pools.get(pool)),
                                      t.seed)
            step1[tid] = trainer.step(1)[M.K3_KL]
        by_seed = {trials[t].seed: v for t, v in step1.items()}
        assert len(by_seed) == 2 and all(  # the correction does not change step 1's mismatch
            v == by_seed[trials[t].seed] for t, v in step1.items())
        rows = {(r["seed"], r["batch"]): r[M.K3_KL] for r in s.measured.rows}
        assert all(rows[(seed, 1)] == v for seed, v in by_seed.items())  # batch 1 is step 1
        k3 = s.metrics["k3"]
        assert k3.low <= statistics.fmean(step1.values()) <= k3.high, (pool, k3, step1)
    a100, h100 = (next(s for s in report.summaries if s.measured.config.pool.name == p)
                  for p in ("sim-a100", "sim-h100"))
    assert a100.metrics["k3"].low > 10 * h100.metrics["k3"].high


def test_attribution_ranks_sim_a100s_known_causes_with_intervals(probed) -> None:
    report, _ = probed
    a100 = next(s for s in report.summaries if s.measured.config.pool.name == "sim-a100")
    ranked = [(a.knob, a.change) for a in a100.attribution]
    engine = [k for k, _ in ranked if k.startswith("engine.")]
    assert engine[:3] == ["engine.weight_lag", "engine.weight_quant", "engine.lm_head"]
    assert ("engine.kv_cache", "fp8->fp32") in ranked
    for a in a100.attribution[:4]:  # stale weights, the pool, int4, the fp8 head: decided > 0
        assert a.delta.decided and a.delta.low > 0 and a.delta.n == 8, a
    # staleness makes most of sim-a100's k3 (orchestrator/pools.yaml), after 2 updates
    assert a100.attribution[0].delta.estimate > 100 * a100.metrics["k3"].estimate


def test_a_second_probe_runs_nothing_new(probed) -> None:
    report, root = probed
    records = sorted((root / "wd" / "probes").iterdir())
    assert len(records) == 2 + sum(len(s.measured.knobs) for s in report.summaries)
    again = probe(str(REPO / GRID), attribute=True, workdir=str(root / "wd"),
                  out=str(root / "again"), track=False)
    assert all(s.measured.cached for s in again.summaries)
    assert sorted((root / "wd" / "probes").iterdir()) == records
    assert [s.metrics["k3"] for s in again.summaries] == [s.metrics["k3"] for s in report.summaries]


def test_the_grids_ledger_holds_what_its_probes_cost_once(probed) -> None:
    """``<workdir>/<grid>/probes.json``, which compare's cost table reads: each configuration's
    hours at its pool's rate, counted when its jobs ran; a probe from the cache adds nothing."""
    report, root = probed
    ledger = root / "wd" / "quickstart" / "probes.json"
    before = probe_ledger.read(ledger.parent)
    assert sorted(before) == sorted(s.measured.config.probe_id for s in report.summaries)
    for s in report.summaries:
        entry = before[s.measured.config.probe_id]
        hours, unit = s.measured.cost
        assert entry["runs"] == 1 and entry["unit"] == unit == "cpu_hours"
        assert entry["label"] == s.label and entry["pool"] == s.measured.config.pool.name
        assert entry["hours"] == pytest.approx(hours, rel=1e-6) and entry["hours"] > 0
    probe(str(REPO / GRID), attribute=True, workdir=str(root / "wd"), out=str(root / "ledger"),
          track=False)
    assert probe_ledger.read(ledger.parent) == before


def test_a_gate_over_its_bound_exits_1_with_one_line(probed, capsys) -> None:
    _, root = probed
    args = ["probe", str(REPO / GRID), "--workdir", str(root / "wd"), "--out",
            str(root / "gate"), "--no-tracking"]
    assert main([*args, "--gate", "k3<=1e-5", "--gate", "bitwise_share>=0"]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if "GATE FAILED" in line]
    assert failed == ["GATE FAILED pool=sim-a100: k3 = 6.79e-05, bound k3<=1e-05"]
    assert main([*args, "--gate", "rollout_corr/k3_kl<=1e-3"]) == 0
    assert "GATE FAILED" not in capsys.readouterr().out


@pytest.mark.parametrize("gate, message", [
    ("k9<=0.1", "unknown metric 'k9'; allowed: k3, k1"),
    ("k3<=abc", "the bound 'abc' is not a finite number"),
    ("k3<=nan", "the bound 'nan' is not a finite number"),
    ("k3 0.1", "expected METRIC<=BOUND"),
])
def test_a_bad_gate_is_one_line_exit_2_and_nothing_runs(tmp_path, capsys, gate, message) -> None:
    code = main(["probe", str(REPO / GRID), "--workdir", str(tmp_path / "wd"), "--out",
                 str(tmp_path / "out"), "--gate", gate, "--no-tracking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "wd" / "probes").exists() and not (tmp_path / "out").exists()


def test_a_verl_grid_plans_a_probe_per_engine_setting_and_pool() -> None:
    """The verl probe at plan time (no verl job; ``tests/verl_cpu/test_verl_probe.py`` runs one):
    grids/verl_cpu.yaml's 4 trials are 2 probes (its correction axis shares one), each the
    trial's config learning nothing."""
    from orchestrator.probe import plan as plan_probe
    from orchestrator.probe.verl_job import VerlProbe, job_config

    grid = load_grid(str(REPO / "grids" / "verl_cpu.yaml"))
    chosen = plan_probe(grid)
    assert chosen.refused == ()
    assert [(c.label, len(c.trials), c.job) for c in chosen.configurations] == [
        ("pool=cpu-fp32", 2, VerlProbe), ("pool=cpu-bf16", 2, VerlProbe)]
    job = job_config(chosen.configurations[0].config)
    assert job["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.0 and job["correction"] == {}
    assert job["trainer"]["test_freq"] == -1


def test_a_probe_is_one_mlflow_run_found_again_by_its_hash(probed) -> None:
    from orchestrator.probe._tracking import PROBE_TAG, log_probe
    from orchestrator.tracking import client

    report, root = probed
    uri = f"sqlite:///{root / 'mlflow.db'}"
    kw = {"tracking_uri": uri, "workdir": str(root / "wd")}
    run_id = log_probe(report.plan, report.summaries, report.files, **kw)
    assert log_probe(report.plan, report.summaries, report.files, **kw) == run_id
    run = client(uri).get_run(run_id)
    a100 = next(s for s in report.summaries if s.measured.config.pool.name == "sim-a100")
    key = f"probe/sim-a100/{a100.measured.config.probe_id}/k3"
    assert run.data.metrics[key] == a100.metrics["k3"].estimate
    assert run.data.metrics[key + "_hi"] == a100.metrics["k3"].high
    assert run.data.tags[PROBE_TAG] and run.data.params["probe.batches"] == "4"
    runs = client(uri).search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]


def test_a_configuration_that_cannot_be_probed_is_named_and_the_rest_probed(probed, monkeypatch,
                                                                            capsys) -> None:
    from orchestrator.sim.probe_job import SimProbe

    _, root = probed
    real = SimProbe.check.__func__  # type: ignore[attr-defined]

    def check(cls, config, pool):  # a trainer that cannot probe one pool's configurations
        return "no probe here (test)" if pool.name == "sim-a100" else real(cls, config, pool)

    monkeypatch.setattr(SimProbe, "check", classmethod(check))
    code = main(["probe", str(REPO / GRID), "--workdir", str(root / "wd"), "--out",
                 str(root / "partial"), "--no-tracking", "--gate", "k3<=1e-5"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0  # the one probed configuration is within the bound
    assert out[0].startswith("pool=sim-h100: k3 8.68e-07") and "(cached)" in out[0]
    refused = [line for line in out if "not probed" in line]
    assert len(refused) == 3 and all("pool=sim-a100" in line and "no probe here (test)" in line
                                     for line in refused)
    assert "## Not probed" in (root / "partial" / "probe.md").read_text()


def test_an_engine_that_computes_like_the_trainer_probes_k3_0_and_bitwise_1(tmp_path) -> None:
    grid = tmp_path / "det.yaml"  # ~2 s: the deterministic engine recomputes the full sequence
    grid.write_text("name: det-probe\nrecipe: sim/grpo_tiny\nbackend: sim\nsteps: 10\n"
                    "seeds: [0]\npool: sim-a100\noverrides: {rollout.deterministic: true}\n"
                    f"recipes_dir: {REPO / 'recipes'}\n")
    report = probe(str(grid), attribute=True, workdir=str(tmp_path / "wd"), batches=2,
                   out=str(tmp_path / "out"), track=False, gates=["bitwise_share>=1", "k3<=0"])
    (s,) = report.summaries
    assert s.metrics["k3"].estimate == 0 and s.metrics["abs_diff_max"].estimate == 0
    assert s.metrics["bitwise_share"].estimate == 1 and not report.failed
    assert s.attribution == () and s.measured.engine["engine.weight_lag"] == 0  # lag dropped
