"""What a user sees in a browser after a grid finished, in Debian's headless chromium driven by
Playwright (the system browser through ``executable_path``; Playwright's own browser builds are
never downloaded).

A small real simulator grid runs through ``ablate submit``, ``ablate compare --out`` writes its
report, and ``ablate ui`` serves the store on a free loopback port. The MLflow UI must show the
grid's parent run with its trial runs nested under it, each with its axis values and verdict in
columns; ``summary.html`` must render its tables and every plot.

``ABLATE_SCREENSHOTS=<dir>`` keeps what the browser saw (``mlflow_ui.png``, ``summary.png``).
"""
from __future__ import annotations

import csv
import os
import shutil
import time
from pathlib import Path

import cliproc
import pytest
from mlflow_server import free_port, healthy
from playwright.sync_api import expect
from rayclusters import write_grid

CHROMIUM = os.environ.get("ABLATE_CHROMIUM") or shutil.which("chromium") or ""
# Every cell of the runs table by row index and column id (ag-grid splits a row into a pinned
# and a scrolling part; both carry the row index).
CELLS_JS = """() => {
  const rows = {};
  for (const cell of document.querySelectorAll('.ag-row [col-id]')) {
    const idx = cell.closest('.ag-row').getAttribute('row-index');
    (rows[idx] = rows[idx] || {})[cell.getAttribute('col-id')] = cell.innerText.trim();
  }
  return rows;
}"""
EXPANDER = 'button[data-component-id*="runnamecellrenderer"]'
ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'  # a side panel

pytestmark = pytest.mark.skipif(not CHROMIUM or not Path(CHROMIUM).exists(),
                                reason="no chromium installed (apt-get install chromium, or set "
                                       "ABLATE_CHROMIUM to its path)")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory):
    """The grid submitted and compared; yields (root, env, trials by id from trials.csv)."""
    root = tmp_path_factory.mktemp("browser")
    write_grid(root / "g.yaml", "browser", steps=20, seeds=[0], levels=["none", "token"],
               pools=["sim-h100", "sim-a100"], every=10, keep=None, retries=None)
    with cliproc.ablate_env(root) as env:
        submit = cliproc.run(["submit", "g.yaml", "--quiet"], env, root)
        assert submit.returncode == 0, submit.stderr[-3000:]
        compare = cliproc.run(["compare", "g.yaml", "--out", "results/browser"], env, root)
        assert compare.returncode == 0, compare.stderr[-3000:]
        with (root / "results" / "browser" / "trials.csv").open() as f:
            trials = {r["trial_id"]: r for r in csv.DictReader(f)}
        assert len(trials) == 4
        yield root, env, trials


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def _screenshot(page, name: str, full_page: bool = False) -> None:
    folder = os.environ.get("ABLATE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=full_page)


def _serve_ui(root: Path, env: dict[str, str], port: int) -> tuple[object, str]:
    proc = cliproc.start(["ui", "g.yaml", "--port", str(port)], env, root, log=root / "ui.log")
    deadline = time.monotonic() + 120
    url = ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, (root / "ui.log").read_text()[-3000:]
        text = (root / "ui.log").read_text()
        if not url and "http://127.0.0.1:" in text:
            url = text.split("MLflow UI for ", 1)[1].split(": ", 1)[1].split()[0]
        if url and healthy(port):
            return proc, url
        time.sleep(0.5)
    cliproc.stop(proc)
    raise AssertionError(f"ablate ui did not come up: {(root / 'ui.log').read_text()[-3000:]}")


@pytest.mark.slow
def test_mlflow_ui_shows_nested_trial_runs_with_axes_and_verdicts(finished, browser) -> None:
    root, env, trials = finished
    port = free_port()
    proc, url = _serve_ui(root, env, port)
    try:
        assert url.startswith(f"http://127.0.0.1:{port}/#/experiments/")
        page = browser.new_page(viewport={"width": 1900, "height": 1000})
        page.goto(url)
        page.wait_for_selector(EXPANDER, timeout=90_000)
        for button in page.locator(ASSISTANT_CLOSE).all():  # it covers the columns on the right
            button.click()
        # Collapsed, the experiment shows one row: the submission's parent run.
        rows = page.evaluate(CELLS_JS)
        assert len(rows) == 1, rows
        assert rows["0"]["attributes.`Run Name`"].split("\n")[-1].startswith("browser 20")
        page.locator(EXPANDER).first.click()  # expand the parent: its trial runs appear under it
        page.wait_for_function(f"() => document.querySelectorAll('.ag-row[row-index=\"{len(trials)}\"]').length > 0",
                               timeout=30_000)
        rows = page.evaluate(CELLS_JS)
        headers = page.eval_on_selector_all(".ag-header-cell[col-id]",
                                            "hs => hs.map(h => h.innerText.trim())")
        for column in ("correction.is_level", "pool", "seed", "trial_id", "verdict"):
            assert column in headers, headers
        for col_id in ("params.`correction.is_level`", "params.`pool`", "tags.`verdict`"):
            expect(page.locator(f'.ag-header-cell[col-id="{col_id}"]')).to_be_in_viewport()
        children = {r["tags.`trial_id`"]: r for i, r in rows.items() if i != "0"}
        assert set(children) == set(trials), rows
        for tid, row in children.items():
            want = trials[tid]
            assert row["params.`correction.is_level`"] == want["correction.is_level"]
            assert row["params.`pool`"] == want["pool"]
            assert row["tags.`verdict`"] == want["verdict"] and want["verdict"]
            assert row["attributes.`Run Name`"].endswith(f"({tid})")
        _screenshot(page, "mlflow_ui.png")
        page.close()
    finally:
        cliproc.stop(proc)


@pytest.mark.slow
def test_summary_html_renders_its_tables_and_every_plot(finished, browser) -> None:
    root, _, trials = finished
    report = root / "results" / "browser" / "summary.html"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    assert page.inner_text("h1") == "Grid browser"
    tables = page.eval_on_selector_all("table", "ts => ts.map(t => [...t.rows].map(r => "
                                                "[...r.cells].map(c => c.innerText.trim())))")
    # the pivot, axis importance, time to collapse per cell, the cost per cell, the trials
    assert len(tables) == 5, tables
    pivot, _, survival, cost, trial_table = tables
    assert survival[0][:4] == ["cell", "trials", "collapsed", "censored"], survival
    assert cost[0][:3] == ["cell", "trials", "cost"] and cost[-1][0] == "grid", cost
    assert all(c.endswith("CPU-h") for c in cost[-1][2:]), cost  # the sim's cost, labelled
    assert pivot[0] == ["correction.is_level", "pool=sim-a100", "pool=sim-h100"]
    assert sorted(r[0] for r in pivot[1:]) == ["none", "token"]
    assert all(cell for r in pivot[1:] for cell in r)  # every cell filled
    assert sorted(r[0] for r in trial_table[1:]) == sorted(trials)
    images = page.eval_on_selector_all(
        "img", "is => is.map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    plots = sorted(p.stem for p in report.parent.glob("*.png"))
    assert sorted(alt for alt, *_ in images) == plots and len(plots) >= 5
    broken = [alt for alt, complete, w, h in images if not (complete and w > 0 and h > 0)]
    assert not broken, f"images that did not load: {broken}"
    _screenshot(page, "summary.png", full_page=True)
    page.close()
