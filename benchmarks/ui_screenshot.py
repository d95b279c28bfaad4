"""Screenshot of the MLflow UI for a grid in headless Chromium: the grid's parent run expanded to
show its nested trial runs, with the axis values (params) and the verdict as columns.

    .venv/bin/python benchmarks/ui_screenshot.py --grid quickstart --port 5000 --out results/x.png

Expects a running MLflow UI (``ablate ui``) on 127.0.0.1. The columns come from a shared view
(an experiment tag, ``tracking.save_trials_view``); expanding the parent row needs a click, done
over the Chrome DevTools protocol (aiohttp websocket) since MLflow does not share that state.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _shoot(ws_url: str, url: str, out: Path, width: int, height: int, wait_s: float) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        counter = 0

        async def call(method: str, **params: object) -> dict:
            nonlocal counter
            counter += 1
            await ws.send_str(json.dumps({"id": counter, "method": method, "params": params}))
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg.get("id") == counter:
                    return msg.get("result", {})

        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(wait_s)
        # Close the assistant side panel and expand every parent row (its "+" expander button).
        script = """(() => {
          const close = [...document.querySelectorAll('button[data-component-id]')]
            .filter(b => /assistant/i.test(b.dataset.componentId) && /close/i.test(b.dataset.componentId));
          close.forEach(b => b.click());
          const buttons = [...document.querySelectorAll('button[data-component-id*="runnamecellrenderer"]')];
          buttons.forEach(b => b.click());
          return buttons.length;
        })()"""
        res = await call("Runtime.evaluate", expression=script, returnByValue=True)
        print("expanded rows:", res.get("result", {}).get("value"))
        await asyncio.sleep(wait_s / 2)
        shot = await call("Page.captureScreenshot", format="png")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", required=True, help="grid name")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--width", type=int, default=1900)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--wait", type=float, default=15.0)
    args = ap.parse_args()
    from orchestrator.tracking import client, save_trials_view

    uri = f"http://127.0.0.1:{args.port}"
    mlc = client(uri)
    exp = mlc.get_experiment_by_name(args.grid)
    if exp is None:
        raise SystemExit(f"no experiment {args.grid!r} at {uri}")
    url = f"{uri}/#/experiments/{exp.experiment_id}/runs?viewStateShareKey={save_trials_view(mlc, exp.experiment_id)}"
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    dbg = _free_port()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                 "--no-first-run", "--disable-background-networking",
                                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                                 f"--remote-debugging-port={dbg}", "--remote-allow-origins=*", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            pages: list[dict] = []
            while time.monotonic() < deadline and not pages:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{dbg}/json", timeout=2) as r:
                        pages = [p for p in json.load(r) if p.get("type") == "page"]
                except OSError:
                    time.sleep(0.5)
            if not pages:
                raise SystemExit("chromium did not start its DevTools endpoint")
            asyncio.run(_shoot(pages[0]["webSocketDebuggerUrl"], url, args.out, args.width, args.height,
                               args.wait))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    print(f"{url}\n-> {args.out}")


if __name__ == "__main__":
    main()
