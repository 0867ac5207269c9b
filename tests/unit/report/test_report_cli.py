"""`kvoffload-lab ingest`, `report --format` and `compare` on copies of the fixture campaign."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from tests.support.small_campaign import copy_small


def test_ingest_writes_raw_and_derived_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = copy_small(tmp_path / "c1")
    assert main(["ingest", str(campaign)]) == 0
    out = capsys.readouterr().out
    assert "cells, requests, rounds, samples, sessions, summary, warnings written" in out
    assert "warning: sessions_differ" in out


def test_report_md_only(tmp_path: Path) -> None:
    campaign = copy_small(tmp_path / "c1")
    assert main(["report", str(campaign), "--format", "md"]) == 0
    assert (campaign / "report" / "report.md").is_file()
    assert not (campaign / "report" / "index.html").exists()


def test_compare_two_campaigns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = copy_small(tmp_path / "run-a"), copy_small(tmp_path / "run-b")
    # Make run-b's gpu cell 20% slower on every TTFT.
    req = b / "cells" / "a1gpu" / "requests.jsonl"
    rows = [json.loads(line) for line in req.read_text().splitlines()]
    for r in rows:
        r["ttft_s"] = r["ttft_s"] * 1.2
    req.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["compare", str(a), str(b), "--figure", "ttft_p50_s", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    gpu = next(r for r in table if r["tier"] == "gpu" and r["concurrency"] == 2)
    assert gpu["run-a"] == pytest.approx(0.135) and gpu["change_pct_run-b"] == pytest.approx(20.0)
    cpu = next(r for r in table if r["tier"] == "cpu" and r["concurrency"] == 2)
    assert cpu["change_pct_run-b"] == pytest.approx(0.0)
    # the validity rules of a report hold across campaigns: b1gpu had a failed request in both
    assert gpu["comparable"] and gpu["not_comparable_reasons"] == ""
    b1 = next(r for r in table if r["tier"] == "gpu" and r["concurrency"] == 8)
    assert not b1["comparable"]
    assert b1["not_comparable_reasons"].startswith("run-a: gpu b1gpu did not run clean (1 failed request(s))")
    assert main(["compare", str(a), str(b), "--figure", "ttft_p50_s"]) == 0
    out = capsys.readouterr().out
    assert "  gpu tiny 8 3 8192 32 0: run-a: gpu b1gpu did not run clean (1 failed request(s))" in out
    assert "gpu tiny 2 3 8192 32 0:" not in out
    assert main(["compare", str(a), str(b), "--figure", "no_such_figure"]) == 2
    assert main(["compare", str(a)]) == 2


def test_compare_lists_the_software_that_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = copy_small(tmp_path / "run-a"), copy_small(tmp_path / "run-b")
    # run-b: LMCache upgraded on gpu1 in every cell (vLLM 0.32.0 / 0.33.0 as in run-a: not listed)
    for path in (b / "cells").glob("*/cell.json"):
        record = json.loads(path.read_text())
        record["software"]["gpu1"]["python"]["/opt/kvoffload/venv"]["lmcache"] = "0.6.0"
        path.write_text(json.dumps(record))
    assert main(["compare", str(a), str(b), "--figure", "ttft_p50_s"]) == 0
    out = capsys.readouterr().out
    assert "software that differs between the campaigns" in out
    lines = [line for line in out.splitlines() if "0.6.0" in line]
    assert len(lines) == 1 and "lmcache" in lines[0] and "0.5.6" in lines[0], out
    assert "0.33.0" not in out
    assert main(["compare", str(a), str(a), "--figure", "ttft_p50_s"]) == 0
    assert "software that differs" not in capsys.readouterr().out
