"""Curves for a compare without the workdir: MLflow's bulk history endpoint on a real loopback
``mlflow server``, its per-reply cap handled, and the one-call-per-run path for other stores."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from mlflow_server import MlflowServer

from orchestrator import metrics as M
from orchestrator.compare import _fetch
from orchestrator.tracking import client

STEPS = {0: 30, 1: 30, 2: 50}  # run index -> points of k3 KL


def _log_runs(uri: str) -> list[str]:
    from mlflow.entities import Metric

    mlc = client(uri)
    exp = mlc.create_experiment("fetch")
    ids = []
    for i, n in STEPS.items():
        run_id = mlc.create_run(exp).info.run_id
        pts = [Metric(M.K3_KL, math.nan if s == 7 else 0.01 * s + i, 1000 + s, s) for s in range(1, n + 1)]
        pts += [Metric(M.EVAL_REWARD, 0.5 + i, 1000 + s, s) for s in (10, 20)]
        pts.append(Metric(M.K3_KL, 99.0, 5000, 3))  # a newer value for step 3 wins
        mlc.log_batch(run_id, metrics=pts)
        ids.append(run_id)
    return ids


def _expected(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return _fetch.newest((p.step, p.timestamp, p.value) for p in client(uri).get_metric_history(run_id, key))


@pytest.mark.slow
def test_bulk_history_splits_full_replies_and_matches_single_calls(tmp_path: Path, monkeypatch) -> None:
    srv = MlflowServer(tmp_path / "srv").start()
    try:
        ids = _log_runs(srv.uri)
        calls = []
        bulk = _fetch._bulk

        def counted(uri, run_ids, key):
            calls.append((len(run_ids), key))
            return bulk(uri, run_ids, key)

        monkeypatch.setattr(_fetch, "_bulk", counted)
        # A cap of 40 points a reply, and expectations too low: the first reply of three runs is
        # cut by the server, so the batch is halved; run 2 alone (51 points) is past the cap.
        monkeypatch.setattr(_fetch, "BULK_MAX_POINTS", 40)
        wanted = {r: {M.K3_KL: 10, M.EVAL_REWARD: 2} for r in ids}
        got = _fetch.fetch_curves(client(srv.uri), srv.uri, wanted)
        for r in ids:
            for key in (M.K3_KL, M.EVAL_REWARD):
                want, have = _expected(srv.uri, r, key), got[r][key]
                assert [s for s, _ in have] == [s for s, _ in want]
                assert all(a == b or (math.isnan(a) and math.isnan(b))
                           for (_, a), (_, b) in zip(have, want)), (r, key)
        assert got[ids[0]][M.K3_KL][2] == (3, 99.0)
        assert (3, M.K3_KL) in calls and (1, M.K3_KL) in calls  # cut, then split
        assert calls.count((3, M.EVAL_REWARD)) == 1  # 6 points: one request for all three
    finally:
        srv.stop()


def test_a_store_without_the_endpoint_gets_one_call_per_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    ids = _log_runs(uri)
    got = _fetch.fetch_curves(client(uri), uri, {ids[2]: {M.K3_KL: 50}})
    assert got[ids[2]][M.K3_KL][:3] == [(1, 2.01), (2, 2.02), (3, 99.0)]
    assert M.EVAL_REWARD not in got[ids[2]]  # not asked for


@pytest.mark.slow
def test_a_hundred_runs_are_read_in_bulk_from_the_gunicorn_server_ablate_ui_starts(
        tmp_path: Path, monkeypatch) -> None:
    """gunicorn (``ablate ui``'s server, ``mlflow server --gunicorn-opts``) answers a request line
    over 4,094 bytes with HTTP 400, and 100 run ids in one query are ~4,100 bytes: such a request
    used to fail, and compare fell back to one call per run and metric (340 s instead of ~20 s
    for 1,000 trials, ``benchmarks/compare_scale.py``). Batches now stay within
    ``BULK_MAX_QUERY_BYTES`` of run ids: every curve comes in bulk, no request is refused."""
    from mlflow.entities import Metric

    srv = MlflowServer(tmp_path / "srv")
    mlc = client(f"sqlite:///{srv.root / 'server.db'}")  # recorded first, then served
    exp = mlc.create_experiment("many")
    ids = []
    for i in range(100):
        run_id = mlc.create_run(exp).info.run_id
        mlc.log_batch(run_id, metrics=[Metric(M.K3_KL, 0.01 * i + s, 1000 + s, s) for s in (1, 2, 3)])
        ids.append(run_id)
    srv.start()
    try:
        assert _fetch._bulk(srv.uri, ids, M.K3_KL) is None  # all 100 at once: refused
        calls, singles = [], []
        bulk, single = _fetch._bulk, _fetch._single

        def counted(uri, run_ids, key):
            got = bulk(uri, run_ids, key)
            calls.append((len(run_ids), got is not None))
            return got

        def counted_single(mlc_, run_id, key):
            singles.append(run_id)
            return single(mlc_, run_id, key)

        monkeypatch.setattr(_fetch, "_bulk", counted)
        monkeypatch.setattr(_fetch, "_single", counted_single)
        got = _fetch.fetch_curves(client(srv.uri), srv.uri, {r: {M.K3_KL: 3} for r in ids})
        assert singles == [] and all(ok for _, ok in calls), calls
        assert sum(n for n, _ in calls) == 100 and len(calls) == 2, calls
        for i, r in enumerate(ids):
            assert got[r][M.K3_KL] == [(s, 0.01 * i + s) for s in (1, 2, 3)], r
    finally:
        srv.stop()
