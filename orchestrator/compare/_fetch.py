"""Where ``ablate compare`` gets each trial's curves, cheapest first.

1. The workdir: a finished trial's ``summary.json`` while it matches its ``metrics.jsonl``
   (``store.summary``), else one pass over the file that also checks it
   (``store.summary_table.LocalMetrics``). No MLflow history call for these trials.
2. The grid's summary table (``store.summary_table``), an artifact of its parent run, for the
   trials whose runs' ``summary.*`` tags it agrees with (``tracking.published_summaries``).
3. MLflow, for the trials the workdir does not have (compare on another machine) or whose file is
   damaged: the run's ``summary.*`` tags give final and peak values; the curves come in bulk from
   the tracking server's ``get-history-bulk`` endpoint (up to 100 runs, a query of at most
   ``BULK_MAX_QUERY_BYTES``, and 25,000 points per request; a full reply is split and asked
   again, as the server cuts a longer one silently, and so is a request the server refuses as
   too long), from a few threads. A store without that endpoint (a SQLite file, an older
   server) gets one ``get_metric_history`` call per run and metric.

Curves read from MLflow are reduced like the summary's (``store.summary.reduce_curve``) once
their final and peak values are taken: the plots need no more than that.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.store.summary import CURVE_METRICS, final_value, peak_value, reduce_curve
from orchestrator.tracking import is_remote

log = logging.getLogger(__name__)

BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
BULK_MAX_POINTS = 25_000  # the server's cap on one reply (mlflow/server/handlers.py)
BULK_MAX_RUNS = 100
# The run ids go in the query string (a GET), and gunicorn, which ``mlflow server --gunicorn-opts``
# and ``ablate ui`` run, refuses a request line over 4,094 bytes (its ``limit_request_line``
# default: gunicorn 26.2.0, ``gunicorn/config.py`` line 920) with HTTP 400: at ~40 bytes a run
# id, 100 of them do not fit (tests/compare/test_fetch.py sees the refusal). Each batch keeps its
# run ids within this many bytes of query, so the request line stays under that limit.
BULK_MAX_QUERY_BYTES = 3_000
THREADS = 4

Curve = list[tuple[int, float]]


def newest(points: Iterable[tuple[int, int, float]]) -> Curve:
    """(step, timestamp, value) points -> one (step, value) per step, the newest timestamp winning."""
    best: dict[int, tuple[int, float]] = {}
    for step, ts, value in points:
        prev = best.get(step)
        if prev is None or ts >= prev[0]:
            best[step] = (ts, float(value))
    return [(s, best[s][1]) for s in sorted(best)]


def _single(mlc: Any, run_id: str, key: str) -> Curve:
    return newest((p.step, p.timestamp, p.value) for p in mlc.get_metric_history(run_id, key))


def _bulk(uri: str, run_ids: Sequence[str], key: str) -> dict[str, Curve] | None:
    """One ``get-history-bulk`` request; None when the reply may have been cut at the cap, or
    the server refused a request of several runs (as too long, the likely reason)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    resp = http_request(get_default_host_creds(uri), BULK_ENDPOINT, "GET",
                        params={"run_id": list(run_ids), "metric_key": key,
                                "max_results": BULK_MAX_POINTS}, max_retries=2, timeout=120)
    if resp.status_code in (400, 414) and len(run_ids) > 1:
        return None  # a server with a shorter request-line limit: asked again in halves
    if resp.status_code != 200:
        raise OSError(f"{BULK_ENDPOINT}: HTTP {resp.status_code}")
    points = resp.json().get("metrics", [])
    if len(points) >= BULK_MAX_POINTS:
        return None
    by_run: dict[str, list[tuple[int, int, float]]] = {r: [] for r in run_ids}
    for p in points:
        by_run.setdefault(p["run_id"], []).append((int(p.get("step", 0)), int(p.get("timestamp", 0)),
                                                   float(p["value"])))
    return {r: newest(pts) for r, pts in by_run.items()}


def _bulk_batches(items: Sequence[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """Runs (with their expected points) in batches a reply can hold and a request line can
    name (``run_id=<id>&`` per run in the query)."""
    out: list[list[tuple[str, int]]] = [[]]
    total = query = 0
    for run_id, n in items:
        n, q = max(n, 1), len(run_id) + len("run_id=&")
        if out[-1] and (total + n > BULK_MAX_POINTS * 0.9 or len(out[-1]) >= BULK_MAX_RUNS
                        or query + q > BULK_MAX_QUERY_BYTES):
            out.append([])
            total = query = 0
        out[-1].append((run_id, n))
        total += n
        query += q
    return [b for b in out if b]


def _fetch_batch(mlc: Any, uri: str, key: str, batch: Sequence[str]) -> dict[str, Curve]:
    """A batch by bulk requests, halved while a reply is full (or the request refused); one run
    alone past the cap (more than 25,000 points) goes through the client, which pages."""
    got = _bulk(uri, batch, key)
    if got is not None:
        return got
    if len(batch) == 1:
        return {batch[0]: _single(mlc, batch[0], key)}
    half = len(batch) // 2
    return {**_fetch_batch(mlc, uri, key, batch[:half]), **_fetch_batch(mlc, uri, key, batch[half:])}


def fetch_curves(mlc: Any, uri: str, wanted: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Curve]]:
    """``{run_id: {key: expected points}}`` -> ``{run_id: {key: curve}}`` (see the module docstring)."""
    out: dict[str, dict[str, Curve]] = {r: {} for r in wanted}
    jobs = [(key, [(r, keys[key]) for r, keys in wanted.items() if key in keys]) for key in CURVE_METRICS]
    if is_remote(uri):
        tasks = [(key, [r for r, _ in batch]) for key, items in jobs for batch in _bulk_batches(items)]
        try:
            with ThreadPoolExecutor(THREADS) as pool:
                for (key, _), got in zip(tasks, pool.map(lambda t: _fetch_batch(mlc, uri, *t), tasks)):
                    for r, curve in got.items():
                        if curve:
                            out[r][key] = curve
            return out
        except Exception as exc:  # noqa: BLE001 - an internal endpoint: any failure falls back
            log.info("bulk metric history unavailable (%s); one call per run and metric", exc)
    for key, items in jobs:
        for r, _ in items:
            curve = _single(mlc, r, key)
            if curve:
                out[r][key] = curve
    return out


def summarised(curves: Mapping[str, Curve]) -> tuple[dict[str, Curve], dict[str, float], dict[str, float]]:
    """Full curves -> (reduced curves, final values, peak values)."""
    return ({k: reduce_curve(v) for k, v in curves.items()}, {k: final_value(v) for k, v in curves.items()},
            {k: peak_value(v) for k, v in curves.items()})
