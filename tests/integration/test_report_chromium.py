"""Render the fixture campaign's report and load it in headless Chromium (Debian's `chromium`).

Console messages, uncaught exceptions and failed loads are collected over the DevTools protocol
(loopback only); a calibration page with a deliberate console error and a missing image proves the
check can fail. The screenshot is kept under tests/artifacts/ (gitignored).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from kvoffload.report import build_report
from tests.support.chromium import CHROMIUM, Page, start_chromium

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "campaign-small"
ARTIFACTS = ROOT / "tests" / "artifacts"


# Section headings in order, and where the findings section starts (CSS pixels from the top).
LAYOUT = (
    "JSON.stringify({h2: [...document.querySelectorAll('h2')].map(h => h.textContent),"
    " findings_top: (document.querySelector('#findings') || {getBoundingClientRect: () => ({top: -1})})"
    ".getBoundingClientRect().top})"
)


async def _load(port: int, url: str, screenshot: Path | None) -> tuple[list[str], str, dict[str, Any]]:
    targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
    ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        page = Page(ws)
        for domain in ("Runtime", "Log", "Page"):
            await page.call(f"{domain}.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride", width=1400, height=1800, deviceScaleFactor=1, mobile=False
        )
        await page.call("Page.navigate", url=url)
        await page.wait_event("Page.loadEventFired")
        await asyncio.sleep(0.5)  # late console messages
        text = (
            await page.call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)
        )["result"]["value"]
        layout = json.loads(
            (await page.call("Runtime.evaluate", expression=LAYOUT, returnByValue=True))["result"]["value"]
        )
        if screenshot is not None:
            shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        return page.problems(), str(text), layout


def _visit(tmp_path: Path, url: str, screenshot: Path | None = None) -> tuple[list[str], str, dict[str, Any]]:
    proc, port = start_chromium(tmp_path / "chromium-profile")
    try:
        return asyncio.run(_load(port, url, screenshot))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def chromium() -> str:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make deps installs it: APT_PACKAGES)")
    return CHROMIUM


def test_console_check_catches_errors(chromium: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="missing.png"><script>console.error("calibration")</script></body></html>'
    )
    problems, _, _ = _visit(tmp_path, bad.as_uri())
    assert any("calibration" in p for p in problems)
    assert any("missing.png" in p or "ERR_FILE_NOT_FOUND" in p for p in problems)


def test_report_loads_without_console_errors(chromium: str, tmp_path: Path) -> None:
    campaign = tmp_path / "fixture-small"
    shutil.copytree(FIXTURE, campaign, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    index = build_report(campaign)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-fixture-small.png"
    problems, text, layout = _visit(tmp_path, index.as_uri(), shot)
    assert problems == []
    assert "kvoffload-lab report: fixture-small" in text
    assert "offload_not_exercised" in text and "Tier comparison" in text
    # The findings are the first section, on the first screen; the campaign settings come last.
    assert layout["h2"][0] == "Findings" and layout["h2"][-1] == "Campaign settings"
    assert 0 <= layout["findings_top"] < 300
    # 4 sessions a side: below the interval's floor, so the change is stated without a verdict word
    assert "NOT A VALID COMPARISON" in text
    # The turn-by-turn view (issue 35): the gpu tier's rounds with their token sources, and its sentence.
    assert "Where each turn's prompt came from" in text and "gpu: TTFT and prompt sources by round" in text
    assert "gpu: from round 2 on, 59 % of prompt tokens came from the GPU prefix cache" in text
    assert "changes later-round p50 TTFT by -20 % (too few sessions" in text
    assert shot.stat().st_size > 20_000  # a real page, not a blank image
