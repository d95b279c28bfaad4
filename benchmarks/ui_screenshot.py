"""Screenshot of the MLflow UI for a grid in headless Chromium: the grid's parent run expanded to
show its nested trial runs, with the axis values (params) and the verdict as columns.

    .venv/bin/python benchmarks/ui_screenshot.py --grid quickstart --port 5000 --out results/x.png

Expects a running MLflow UI (``ablate ui``) on 127.0.0.1. The columns come from a shared view
(an experiment tag, ``tracking.save_trials_view``); expanding the parent row needs a click, which
Playwright does in Debian's chromium (``--chromium``; Playwright's own browsers are never
downloaded). ``tests/tracking/test_ui_browser.py`` asserts what this shows.

Beside the PNG it writes ``<name>.json``: the trial ids the page showed, read from its rows, so
``tests/test_manifest.py`` can hold a committed screenshot to the ``trials.csv`` beside it (a
screenshot of an older run of the grid shows other ids).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path

TRIAL_ID = re.compile(r"\((t[0-9a-f]{12})\)")  # a trial run's name ends in "(<trial id>)"
EXPANDER = 'button[data-component-id*="runnamecellrenderer"]'
ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'  # a side panel


def shoot(url: str, out: Path, *, chromium: str, width: int, height: int,
          timeout_s: float) -> tuple[int, list[str]]:
    """Open ``url``, close the assistant panel, expand every parent run, save a PNG; returns
    how many rows the runs table shows and the trial ids in them."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.wait_for_selector(EXPANDER, timeout=timeout_s * 1000)
            for button in page.locator(ASSISTANT_CLOSE).all():
                button.click()
            parents = page.locator(EXPANDER).count()
            for i in range(parents):
                page.locator(EXPANDER).nth(i).click()
            page.wait_for_function(f"() => document.querySelectorAll('.ag-row[row-index]').length "
                                   f"> {parents}", timeout=timeout_s * 1000)
            rows = page.evaluate("() => new Set([...document.querySelectorAll('.ag-row')]"
                                 ".map(r => r.getAttribute('row-index'))).size")
            shown = sorted(set(TRIAL_ID.findall(page.inner_text(".ag-root"))))
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
            return int(rows), shown
        finally:
            browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", required=True, help="grid name")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--width", type=int, default=1900)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the runs table")
    ap.add_argument("--chromium", default=os.environ.get("ABLATE_CHROMIUM") or shutil.which("chromium"),
                    help="the chromium executable (default: chromium on PATH)")
    args = ap.parse_args()
    if not args.chromium:
        raise SystemExit("no chromium found: apt-get install chromium, or pass --chromium PATH")
    from orchestrator.tracking import client, save_trials_view

    uri = f"http://127.0.0.1:{args.port}"
    mlc = client(uri)
    exp = mlc.get_experiment_by_name(args.grid)
    if exp is None:
        raise SystemExit(f"no experiment {args.grid!r} at {uri}")
    url = f"{uri}/#/experiments/{exp.experiment_id}/runs?viewStateShareKey={save_trials_view(mlc, exp.experiment_id)}"
    rows, shown = shoot(url, args.out, chromium=args.chromium, width=args.width,
                        height=args.height, timeout_s=args.wait)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"screenshot": "mlflow-ui", "grid": args.grid, "rows": rows, "trial_ids": shown}, indent=1) + "\n")
    print(f"{url}\n{rows} rows (parent and trial runs), {len(shown)} trial ids -> {args.out}")


if __name__ == "__main__":
    main()
