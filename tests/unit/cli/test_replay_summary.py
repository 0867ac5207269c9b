"""The TTFT line `kvoffload-lab replay` ends with."""

from __future__ import annotations

import json
from pathlib import Path

from kvoffload.cli.replay import ttft_summary


def _write(path: Path, rows: list[dict[str, object]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def test_round_one_and_later_rounds_are_summarised_apart(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [{"round": 1, "status": "ok", "ttft_s": t} for t in (0.5, 0.7)]
    rows += [{"round": 2, "status": "ok", "ttft_s": t / 1000} for t in range(1, 21)]  # 1..20 ms
    rows += [{"round": 3, "status": "error", "ttft_s": None}]
    rows += [{"round": 2, "status": "timeout", "ttft_s": 9.0}]
    line = ttft_summary(_write(tmp_path / "requests.jsonl", rows, tail='{"round": 2, "sta'))
    assert line == (
        "replay: TTFT ms (ok requests) all 22: p50 11 / p95 500; round 1 2: p50 500 / p95 700; "
        "later rounds 20: p50 10 / p95 19"
    )


def test_nothing_to_summarise_gives_no_line(tmp_path: Path) -> None:
    assert ttft_summary(tmp_path / "missing.jsonl") is None
    failed = _write(tmp_path / "requests.jsonl", [{"round": 1, "status": "error", "ttft_s": None}])
    assert ttft_summary(failed) is None
