"""`kvoffload-lab report --format json|csv`: figures rounded to six significant digits."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from kvoffload.cli.report import round_figure

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign-small"


def _digits(value: float) -> int:
    """Significant digits of a float as printed (repr)."""
    mantissa = repr(abs(value)).split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    return len(mantissa)


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v)]
    return []


def test_round_figure_keeps_six_significant_digits() -> None:
    assert round_figure(0.13499999999999998) == 0.135
    assert round_figure(26.086956521739154) == 26.087
    assert round_figure(123456789.0) == 123457000.0
    assert round_figure({"a": [1.0000001, "x", 3, None]}) == {"a": [1.0, "x", 3, None]}
    assert math.isnan(round_figure(float("nan")))
    assert round_figure(True) is True


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("report") / "c1"
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    return dest


def test_json_figures_are_rounded(campaign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(campaign), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    floats = _floats(doc)
    assert floats and max(_digits(f) for f in floats) <= 6
    gpu = next(c for c in doc["summary"] if c["cell_id"] == "a1gpu")
    assert gpu["ttft_degradation_p50_pct"] == 26.087  # 26.086956521739154 unrounded


def test_csv_figures_are_rounded(campaign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(campaign), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    gpu = next(r for r in rows if r["cell_id"] == "a1gpu")
    assert gpu["ttft_mean_s"] == "0.135" and gpu["ttft_degradation_p50_pct"] == "26.087"
    numbers = [float(v) for r in rows for v in r.values() if v.replace(".", "", 1).isdigit() and "." in v]
    assert numbers and max(_digits(n) for n in numbers) <= 6
