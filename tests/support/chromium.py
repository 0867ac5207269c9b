"""Headless Chromium driven over the DevTools protocol (loopback only), for the tests that load a page
in a real browser: the report (tests/integration/test_report_chromium.py) and the live page of
`watch` (tests/integration/test_watch_chromium.py, tests/lab/test_lab_campaign.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

CHROMIUM = shutil.which("chromium")
# Where the browser tests leave their screenshots: tests/artifacts/.
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class Page:
    """One Chromium page driven over the DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), timeout=30)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    async def wait_event(self, method: str, timeout: float = 30) -> None:
        if any(e.get("method") == method for e in self.events):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = await asyncio.wait_for(self.ws.receive_json(), timeout=deadline - time.monotonic())
            self.events.append(msg)
            if msg.get("method") == method:
                return
        raise TimeoutError(method)

    def problems(self) -> list[str]:
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: {json.dumps(p.get('args'))[:300]}")
            elif m == "Runtime.exceptionThrown":
                out.append(f"exception: {json.dumps(p.get('exceptionDetails'))[:300]}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out


def start_chromium(profile: Path) -> tuple[subprocess.Popen[str], int]:
    assert CHROMIUM is not None
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"chromium exited {proc.returncode} before DevTools came up")
        m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise TimeoutError("chromium: no 'DevTools listening' line within 60 s")


async def _watch_page(
    port: int,
    url: str,
    ready: str,
    screenshot: Path,
    timeout: float,
    probe: str,
    give_up: Callable[[], str | None],
) -> tuple[list[str], str, Any]:
    """Load `url`, wait until the JavaScript expression `ready` is true, screenshot the whole page."""
    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
    ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        page = Page(ws)
        for domain in ("Runtime", "Log", "Page"):
            await page.call(f"{domain}.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False
        )
        await page.call("Page.navigate", url=url)
        await page.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + timeout
        while True:
            answer = await page.call("Runtime.evaluate", expression=f"!!({ready})", returnByValue=True)
            if answer["result"].get("value") is True:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never showed: {ready}")
            why = give_up()
            if why is not None:
                raise AssertionError(f"the page never showed {ready}: {why}")
            await asyncio.sleep(0.3)
        text = (
            await page.call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)
        )["result"]["value"]
        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        found = (await page.call("Runtime.evaluate", expression=probe, returnByValue=True))["result"]
        return page.problems(), str(text), json.loads(found["value"]) if "value" in found else None


def screenshot_when(
    profile: Path,
    url: str,
    ready: str,
    screenshot: Path,
    timeout: float = 60,
    probe: str = "'null'",
    give_up: Callable[[], str | None] = lambda: None,
) -> tuple[list[str], str, Any]:
    """Open `url` in a fresh headless Chromium, wait for `ready` (a JavaScript expression; `give_up`
    saying why not stops the wait earlier), keep a screenshot; the console's problems, the page's
    text and what `probe` (a JavaScript expression giving JSON text) found in the DOM."""
    proc, port = start_chromium(profile)
    try:
        return asyncio.run(_watch_page(port, url, ready, screenshot, timeout, probe, give_up))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
