"""`kvoffload-lab report|compare --format json|csv`: figures rounded to six significant digits."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from kvoffload.report.rounding import round_figure


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


def test_report_json_and_csv_round_their_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    import pandas as pd

    from kvoffload.report import build

    summary = pd.DataFrame({"cell_id": ["a1gpu"], "requests": [12], "ttft_mean_s": [0.13499999999999998]})
    monkeypatch.setattr(build, "analyse", lambda _d: types.SimpleNamespace(summary=summary))
    monkeypatch.setattr(build, "conclude", lambda _a: None)
    doc = {
        "summary": [{"cell_id": "a1gpu", "ttft_p50_s": 0.13499999999999998}],
        "findings": [26.086956521739154],
    }
    monkeypatch.setattr(build, "report_json", lambda _a, _c: json.dumps(doc))
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"summary": [{"cell_id": "a1gpu", "ttft_p50_s": 0.135}], "findings": [26.087]}
    assert max(_digits(f) for f in _floats(out)) <= 6
    assert main(["report", str(tmp_path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows == [{"cell_id": "a1gpu", "requests": "12", "ttft_mean_s": "0.135"}]


def test_compare_json_and_csv_round_their_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    import pandas as pd

    from kvoffload.analysis import compare
    from kvoffload.report import build

    summary = pd.DataFrame({"cell_id": ["x"], "tier": ["gpu"], "ttft_p50_s": [0.1 / 3]})
    monkeypatch.setattr(
        build, "analyse", lambda _d: types.SimpleNamespace(summary=summary, software=pd.DataFrame())
    )
    table = pd.DataFrame(
        {"tier": ["gpu"], "figure": ["ttft_p50_s"], "a": [0.1 / 3], "change_pct_b": [100 / 3]}
    )
    monkeypatch.setattr(compare, "compare_campaigns", lambda _s, _f: table.copy())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    argv = ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--figure", "ttft_p50_s"]
    assert main([*argv, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"tier": "gpu", "figure": "ttft_p50_s", "a": 0.0333333, "change_pct_b": 33.3333}
    ]
    assert main([*argv, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "gpu,ttft_p50_s,0.0333333,33.3333"
