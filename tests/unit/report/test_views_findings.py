"""Issue 53, item 5: the findings as a table a person scans (tier, change against gpu with its interval,
verdict, short warning tags), each tag explained once per group, the long sentences kept in a details
block (report/views.py `findings_view`, the report template)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvoffload.analysis.findings import Finding
from kvoffload.analysis.noise import CpuSpread
from kvoffload.report import build_report
from kvoffload.report.views import findings_markdown, findings_view
from tests.support.small_campaign import copy_small

# The demo's c=2 group: the client and node are virtual hosts of one machine, so both roles show the
# very same CPU spread between the same two cells.
SPREADS = [
    CpuSpread("client", 19.0, 59.0, "f3d4813c09", "3f6e46f16c", 3),
    CpuSpread("node", 19.0, 59.0, "f3d4813c09", "3f6e46f16c", 3),
]
SCRAPE = "the metrics scrape has gaps (2 of 40 scrapes missing)"


def _finding(tier: str, **kw: Any) -> Finding:
    vs_gpu = tier != "gpu"
    base: dict[str, Any] = {
        "group": "m c=2", "model": "m", "concurrency": 2, "num_rounds": 5, "isl": 12000, "osl": "32",
        "tier": tier, "cells": [f"{tier}-cell"], "repeats": 1, "comparable": True,
        "not_comparable_reasons": [],
        "caveats": [f"{tier}-cell: {SCRAPE}" for tier in ("gpu", "cpu")] + [s.text() for s in SPREADS],
        "offload_exercised": True if vs_gpu else None, "later_p50_s": 0.0183,
        "later_p50_ci_s": [0.0144, 0.0211], "later_p95_s": 0.0473, "later_p95_ci_s": None,
        "p50_change_vs_gpu_pct": None, "p50_change_ci_pct": None, "p95_change_vs_gpu_pct": None,
        "p95_change_ci_pct": None, "sessions": 32,
        "gpu_prefix_token_share": None, "lmcache_token_share": None, "lmcache_l1_hit_share": None,
        "lmcache_l2_hit_share": None, "routing": None, "statement": f"{tier}: a long sentence.",
        "gpu_repeats": 1 if vs_gpu else None, "one_repeat": True,
        "cpu_spread": [s.as_dict() for s in SPREADS],
    }  # fmt: skip
    return Finding(**{**base, **kw})


def _group() -> list[Finding]:
    return [
        _finding("gpu"),
        _finding("cpu", p50_change_vs_gpu_pct=-8.0, p50_change_ci_pct=[-34.0, 28.0],
                 p95_change_vs_gpu_pct=-15.0, p95_change_ci_pct=[-44.0, 73.0],
                 p50_verdict="indistinguishable", p50_within_noise=True, repeats_to_separate=45),
        _finding("nvme", p50_change_vs_gpu_pct=-86.0, p50_change_ci_pct=[-90.0, -76.0],
                 p95_change_vs_gpu_pct=-69.0, p95_change_ci_pct=[-76.0, -60.0], p50_verdict="faster",
                 p50_within_noise=False),
    ]  # fmt: skip


def test_the_findings_are_rows_with_the_change_its_interval_the_verdict_and_tags() -> None:
    view = findings_view(_group())
    assert view.table.headers == [
        "tier", "later-round TTFT p50 / p95 (s)", "p50 vs gpu [95 % CI]", "p95 vs gpu [95 % CI]",
        "verdict (p50)", "warnings",
    ]  # fmt: skip
    assert view.table.rows == [
        ["gpu", "0.018 / 0.047", "–", "–", "baseline", "caveat"],
        ["cpu", "0.018 / 0.047", "-8 % [-34, +28]", "-15 % [-44, +73]", "not distinguishable from gpu",
         "within-noise, one-repeat, cpu-spread, caveat"],
        ["nvme", "0.018 / 0.047", "-86 % [-90, -76]", "-69 % [-76, -60]", "faster than gpu",
         "one-repeat, cpu-spread"],
    ]  # fmt: skip
    assert view.tags[2] == ["one-repeat", "cpu-spread"]
    assert view.statements == ["gpu: a long sentence.", "cpu: a long sentence.", "nvme: a long sentence."]
    # an invalid group gives no verdict and says why once
    bad = [
        _finding(t, comparable=False, not_comparable_reasons=["session counts differ"])
        for t in ("gpu", "cpu")
    ]
    invalid = findings_view(bad)
    assert [r[4] for r in invalid.table.rows] == ["baseline", "NOT VALID: no verdict"]
    assert invalid.notes[0] == ("not-valid", "not a valid comparison: session counts differ")


def test_a_warning_repeated_in_two_findings_is_explained_once_per_group() -> None:
    """The CPU spread is in the caveats of every finding of the group, once per role (client, node) that
    showed it; the scrape gap twice, once per cell: each is printed once."""
    view = findings_view(_group())
    notes = dict(view.notes)
    assert list(notes) == ["within-noise", "one-repeat", "cpu-spread", "caveat"]
    assert notes["cpu-spread"] == (
        "the client and node hosts' CPU utilization (the same figures on each) ranged 19-59 % between this "
        "group's cells (f3d4813c09 19 %, 3f6e46f16c 59 %; 25 points or more is wide): a TTFT difference "
        "between them may be the host's load, not the tier's"
    )
    assert notes["caveat"] == f"gpu-cell, cpu-cell: {SCRAPE}"  # not the spreads again
    assert notes["within-noise"].startswith("the 95 % interval of the p50 change includes 0")
    assert "cpu: about " in notes["within-noise"] and "nvme" not in notes["within-noise"]
    md = "\n".join(findings_markdown(view))
    assert md.count("19-59 %") == 1 and md.count(SCRAPE) == 1
    assert "| **cpu-spread** | the client and node hosts' CPU utilization" in md
    assert md.index("| cpu | 0.018 / 0.047 | -8 % [-34, +28] |") < md.index("- cpu: a long sentence.")


def test_the_html_report_shows_the_findings_table_and_keeps_the_sentences_in_details(tmp_path: Path) -> None:
    index = build_report(copy_small(tmp_path / "fixture-small"))
    html = index.read_text()
    findings = html[
        html.index('<section id="findings">') : html.index("</section>", html.index('id="findings"'))
    ]
    assert findings.count('<table class="fit findings">') == 2  # one per comparison group
    assert '<td><span class="tag">no-interval</span><span class="tag">one-repeat</span></td>' in findings
    assert "<li><strong>one-repeat</strong>: one repeat per cell" in findings
    # the sentences only inside the closed details block
    details = findings[findings.index("<details>") :]
    assert findings.index("cpu changes later-round p50 TTFT by -20 %") > findings.index("<details>")
    assert "<summary>the findings in full sentences</summary>" in details
    # no slo: the decision section opens with why there is no pick
    assert (
        '<p class="pick nopick" id="pick"><strong>no pick</strong> — the campaign sets no latency target'
        in html
    )
