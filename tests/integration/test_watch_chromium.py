"""`kvoffload-lab watch` on a results folder caught mid-run, served on loopback and loaded in headless
Chromium: the page polls its JSON and shows the running cell's progress, its live figures, the failed
cell with its reason, and the findings of the finished cells. A screenshot goes under tests/artifacts/.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.chromium import ARTIFACTS, CHROMIUM, screenshot_when
from tests.support.watch import mid_run_campaign

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
# Each sparkline of the page: its figure -> whether its SVG has a line (JSON text, for the DevTools call).
SPARKS = (
    "JSON.stringify(Object.fromEntries([...document.querySelectorAll('.spark')].map("
    "d => [d.dataset.series, d.querySelector('polyline').getAttribute('points').length > 0])))"
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    campaign = mid_run_campaign(tmp_path, offset=time.time() - 2045.0)  # caught 45 s into its replay
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvoffload.cli.main", "watch", str(campaign), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    try:
        assert url.startswith("http://127.0.0.1:"), url  # loopback by default
        yield url, campaign
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_endpoint_and_the_page_on_loopback(served: tuple[str, Path], tmp_path: Path) -> None:
    url, campaign = served
    page = httpx.get(url, timeout=10)
    assert page.status_code == 200 and "<script" in page.text
    assert "src=" not in page.text and 'href="http' not in page.text  # no external asset
    state = httpx.get(url + "state.json", timeout=10).json()
    assert state["campaign"] == "fixture-small" and state["progress"]["done"] == 3
    assert httpx.get(url + "nothing", timeout=10).status_code == 404
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make deps installs it: APT_PACKAGES)")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "watch-fixture-mid-run.png"
    # the findings come from their own thread: wait until they are on the page too
    ready = "document.querySelector('#nodes .progress') && document.querySelector('#findings .finding')"
    problems, text, sparks = screenshot_when(tmp_path / "chromium-profile", url, ready, shot, probe=SPARKS)
    assert problems == []
    assert "30/120 requests" in text  # the running cell's replay
    assert "b2cpu: replay" in text
    assert "b1gpu: interrupted" in text  # the failed cell and why
    assert "TTFT p50 100 ms, p95 190 ms" in text  # the replicas' histogram (tests/unit/report/test_live.py)
    assert "local hit: 50.0 %" in text and "KV usage: 70.0 %" in text
    assert "cpu changes later-round p50 TTFT by -20 %" in text  # the report's own finding
    assert "cells 3 done, 1 failed of 7" in text
    assert shot.stat().st_size > 20_000
    # a sparkline per live figure of the running cell; those with two or more points have a line
    assert sparks == {
        "local hit": True,
        "external hit": False,
        "LMCache L1 hit": False,
        "LMCache L2 hit": False,
        "KV usage": True,
        "L1": False,
        "L2": False,
    }
    assert not (campaign / "tables").exists()  # the watcher only reads the results folder
