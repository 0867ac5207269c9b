"""The raw JSON format: the kept H200 runs load, round-trip, and bad files are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.calibrate.raw import load_raw, write_raw
from kvoffload.errors import UserError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "calibrate"


def test_fixture_holds_a_complete_h200_run(raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    assert raw.environment.device_name == "NVIDIA H200"
    assert raw.environment.driver and raw.environment.torch.startswith("2.")
    assert raw.shape.kv_bytes_per_token == 131072
    assert [p.context_tokens for p in raw.prefill.points] == [2**k for k in range(10, 18)]
    assert len(raw.decode.points) >= 10
    assert raw.transfer.chunk_bytes == 256 * 131072
    assert raw.disk.o_direct


def test_round_trip(tmp_path: Path, raw_llama8b_path: Path) -> None:
    raw = load_raw(raw_llama8b_path)
    out = tmp_path / "sub" / "again.json"
    write_raw(raw, out)
    assert load_raw(out) == raw


def test_missing_key_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format_version": 1}', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad.json: not a calibrate raw file \(shape: Field required"):
        load_raw(bad)


def test_missing_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--from-raw .*none.json: cannot read"):
        load_raw(tmp_path / "none.json")
