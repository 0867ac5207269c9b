"""Render the fixture campaign's report and load it in headless Chromium (Debian's `chromium`).

Console messages, uncaught exceptions and failed loads are collected over the DevTools protocol
(loopback only); a calibration page with a deliberate console error and a missing image proves the
check can fail. The screenshot is kept under tests/artifacts/ (gitignored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvoffload.report import build_report
from tests.support.chromium import ARTIFACTS, CHROMIUM, screenshot_when
from tests.support.small_campaign import copy_small

pytestmark = pytest.mark.integration


# Section headings in order, and where the findings section starts (CSS pixels from the top).
LAYOUT = (
    "JSON.stringify({h2: [...document.querySelectorAll('h2')].map(h => h.textContent),"
    " findings_top: (document.querySelector('#findings') || {getBoundingClientRect: () => ({top: -1})})"
    ".getBoundingClientRect().top})"
)


def _visit(tmp_path: Path, url: str, screenshot: Path | None = None) -> tuple[list[str], str, dict[str, Any]]:
    """Load `url` in headless Chromium; its console problems, text and LAYOUT, once it has been up a
    second (late console messages count too)."""
    shot = screenshot or tmp_path / "page.png"
    problems, text, layout = screenshot_when(
        tmp_path / "chromium-profile", url, "performance.now() > 1000", shot, probe=LAYOUT
    )
    return problems, text, layout


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
    campaign = copy_small(tmp_path / "fixture-small")
    index = build_report(campaign)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-fixture-small.png"
    problems, text, layout = _visit(tmp_path, index.as_uri(), shot)
    assert problems == []
    assert "kvoffload-lab report: fixture-small" in text
    assert "offload_not_exercised" in text and "Tier comparison" in text
    # The decision (here only what it needs: the fixture has no slo) and the findings open the first
    # screen; the campaign settings come last.
    assert layout["h2"][:2] == ["Which tier, at what scale, at what cost", "Findings"]
    assert layout["h2"][-1] == "Campaign settings"
    assert 0 <= layout["findings_top"] < 600
    # 4 sessions a side: below the interval's floor, so the change is stated without a verdict word
    assert "NOT A VALID COMPARISON" in text
    # The turn-by-turn view (issues 35, 43): per comparison group, over its valid cells; a1gpu's
    # per-request sources disagree with its counters, so it is left out and named; the cpu tier's rounds
    # show what every request says (cached and recomputed tokens).
    assert "Where each turn's prompt came from" in text and "cpu: TTFT and prompt sources by round" in text
    assert "Left out: a1gpu (the per-request token sources disagree with the counters" in text
    assert "cached tokens (GPU or LMCache)" in text
    assert "cpu: hit share by the turn's age" in text and "< 2 s" in text
    assert "changes later-round p50 TTFT by -20 % (too few sessions" in text
    assert shot.stat().st_size > 20_000  # a real page, not a blank image
