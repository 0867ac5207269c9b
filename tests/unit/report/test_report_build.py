"""build_report on the hand-made fixture campaign: figures, warnings, files, self-containment."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kvoffload.cli.main import main
from kvoffload.errors import UserError
from kvoffload.report import build_report
from kvoffload.report.build import analyse, summary_csv, summary_json

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign-small"


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    dest = tmp_path / "fixture-small"
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    return dest


def test_summary_figures_match_the_fixture_design(campaign: Path) -> None:
    s = analyse(campaign).summary.set_index("cell_id")
    # TTFTs of a1gpu: 0.10 + 0.02 (k-1) + 0.01 (u-1) for k = 1..3, u = 1..4; median of the 12 = 0.135.
    assert s.loc["a1gpu", "ttft_p50_s"] == pytest.approx(0.135)
    assert s.loc["a2cpu", "ttft_p50_s"] == pytest.approx(0.8 * 0.135)
    # 4 users x (100 + 200 + 300) prompt tokens over 150 s of requests.
    assert s.loc["a1gpu", "input_tokens_per_s"] == pytest.approx(2400 / 150)
    assert s.loc["a1gpu", "local_hit_rate"] == pytest.approx(0.5)
    assert s.loc["a2cpu", "external_hit_rate"] == pytest.approx(20 / 40)
    assert s.loc["a3nvme", "external_hit_rate"] == pytest.approx(10 / 40)
    assert s.loc["a1gpu", "prefill_mean_s"] == pytest.approx(0.1)
    assert s.loc["a1gpu", "queue_mean_s"] == pytest.approx(0.005)
    assert s.loc["a3nvme", "disk_read_gbps"] == pytest.approx(0.1)
    assert s.loc["a3nvme", "disk_write_latency_ms"] == pytest.approx(2.0)
    assert s.loc["a3nvme", "disk_util_pct"] == pytest.approx(50.0)
    assert s.loc["a3nvme", "gpu_power_w"] == pytest.approx(620.0)
    assert pd.isna(s.loc["a1gpu", "gpu_power_w"])  # no GPU telemetry there: absent, not 0
    # 2 chunks/s; the lmcache snapshots hold the counter values of T0 and T0+150.
    assert s.loc["a3nvme", "lmcache_l1_evicted_chunks"] == pytest.approx(2.0 * 150)
    assert s.loc["b1gpu", "requests_error"] == 1
    assert s.loc["b2cpu", "scrape_failures"] == 2


def test_report_files_and_warnings(campaign: Path) -> None:
    index = build_report(campaign)
    assert index == campaign / "report" / "index.html"
    md = (campaign / "report" / "report.md").read_text()
    for kind in (
        "concurrency_above_ceiling",
        "cell_not_done",
        "failed_requests",
        "scrape_gaps",
        "sessions_differ",
        "offload_not_exercised",
    ):
        assert f"**{kind}**" in md
    assert "| gpu | a1gpu | 4/4 | 12/12 |" in md
    html = index.read_text()
    assert html.count("<svg") >= 7  # 4 plots for group a (incl. disk), 3 for group b
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from a network
    for name in ("summary", "rounds", "warnings", "requests", "samples"):
        assert (campaign / "tables" / f"{name}.parquet").is_file()


def test_report_shows_each_hosts_software_and_flags_the_vllm_change(campaign: Path) -> None:
    index = build_report(campaign)
    md = (campaign / "report" / "report.md").read_text()
    header = "| host | roles | cells | vllm | lmcache | kvoffload-lab | torch | caddy | node-exporter |"
    assert header + " GPU driver | CUDA |" in md  # no ROCm column: no host reported one
    # b2cpu ran vLLM 0.33.0 on gpu1, every other cell 0.32.0 (fixture README)
    assert "| client | client,lb | all | – | – | 0.1.0 | – | 2.6.2-5 | 1.5.0-1+b6 | – | – |" in md
    gpu1 = "| gpu1 | lmcache,vllm | all but b2cpu | 0.32.0 | 0.5.6 | 0.1.0 | 2.9.0 | – | 1.5.0-1+b6 |"
    assert gpu1 + " 580.159.04 | 13.0 |" in md
    assert "| gpu1 | lmcache,vllm | b2cpu | 0.33.0 | 0.5.6 |" in md
    assert md.index("### Software per host") < md.index("## Validity warnings")
    assert (
        "- **software_differs**: not comparable across these cells: vllm differs on the lmcache, vllm hosts "
        "(0.32.0 in a1gpu, a2cpu, a3nvme, b1gpu; 0.33.0 in b2cpu)"
    ) in md
    assert '**controller software versions**: {"kvoffload-lab": "0.1.0", "python": "3.11.2"}' in md
    html = index.read_text()
    assert "<h3>Software per host</h3>" in html
    assert "<td>all but b2cpu</td><td>0.32.0</td>" in html
    assert "<strong>software_differs</strong>" in html


def test_summary_json_and_csv(campaign: Path) -> None:
    summary = analyse(campaign).summary
    records = json.loads(summary_json(summary))
    assert [r["cell_id"] for r in records] == ["a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"]
    assert records[0]["gpu_power_w"] is None and records[0]["tier"] == "gpu"
    csv = summary_csv(summary).splitlines()
    assert csv[0].startswith("cell_id,tier,model") and len(csv) == 6


def test_cli_report_json_to_file_and_bad_flags(campaign: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    assert main(["report", str(campaign), "--format", "json", "--output", str(out)]) == 0
    assert len(json.loads(out.read_text())) == 5
    assert main(["report", str(campaign), "--format", "json", "--format", "csv"]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_campaign_without_cells_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cells").mkdir(parents=True)
    with pytest.raises(UserError, match="no cell folders"):
        build_report(tmp_path / "empty")


def test_report_of_a_campaign_whose_cells_were_all_skipped(tmp_path: Path) -> None:
    cell = tmp_path / "broken" / "cells" / "x"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text("{}")
    index = build_report(tmp_path / "broken")
    md = (index.parent / "report.md").read_text()
    assert "**skipped_cell** [x]" in md and "cell_id" in md
    assert "<svg" not in index.read_text()
