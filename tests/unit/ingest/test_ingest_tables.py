"""Ingest of the hand-made fixture campaign and of edge-case files into typed tables."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvoffload.errors import UserError
from kvoffload.ingest import TABLES_SCHEMA_VERSION, ingest_campaign, ingest_needed, load_tables
from kvoffload.ingest.jsonl import read_requests, read_samples
from tests.support.small_campaign import copy_small


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    return copy_small(tmp_path / "campaign-small")


def test_ingest_fixture_campaign(campaign: Path) -> None:
    out = ingest_campaign(campaign)
    t = load_tables(campaign)
    # 4 users x 3 rounds in a1, a2, a3, b1 and 3 users x 3 rounds in b2.
    assert len(t.requests) == 4 * 12 + 9
    assert sorted(t.cells["cell_id"]) == ["a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"]
    assert len(t.sessions) == 5
    cells = t.cells.set_index("cell_id")
    assert cells.loc["b1gpu", "status"] == "interrupted" and not cells.loc["b1gpu", "done"]
    assert cells.loc["a3nvme", "l2_device"] == "loop3" and cells.loc["a3nvme", "osl"] == "32"
    assert json.loads(cells.loc["a3nvme", "targets"])["lmcache"]["kind"] == "lmcache"
    software = json.loads(cells.loc["b2cpu", "software"])
    assert software["gpu1"]["python"]["/opt/kvoffload/venv"]["vllm"] == "0.33.0"
    assert software["client"]["groups"] == ["client", "lb"]
    phases = t.samples.groupby("phase").size().to_dict()
    assert set(phases) == {"run", "before", "after"}
    # Snapshot rows: one per series of every target at both ends.
    assert phases["before"] == phases["after"]
    assert t.campaign["name"] == "fixture-small"
    meta = pq.read_schema(out / "requests.parquet").metadata
    assert meta[b"kvoffload.schema"] == str(TABLES_SCHEMA_VERSION).encode()


def test_cell_json_without_software_ingests_as_an_empty_map(campaign: Path) -> None:
    # results written before cell.json had `software`
    path = campaign / "cells" / "a1gpu" / "cell.json"
    record = json.loads(path.read_text())
    del record["software"]
    path.write_text(json.dumps(record))
    ingest_campaign(campaign)
    assert load_tables(campaign).cells.set_index("cell_id").loc["a1gpu", "software"] == "{}"


def test_labels_are_canonical_json(campaign: Path) -> None:
    ingest_campaign(campaign)
    samples = load_tables(campaign).samples
    labels = set(samples["labels"])
    assert '{"engine":"0","model_name":"tiny"}' in labels
    assert '{"cpu":"0","mode":"idle"}' in labels
    assert "{}" in labels
    for text in labels:
        assert json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")) == text


def test_ingest_needed_tracks_inputs(campaign: Path) -> None:
    assert ingest_needed(campaign)
    ingest_campaign(campaign)
    assert not ingest_needed(campaign)
    req = campaign / "cells" / "a1gpu" / "requests.jsonl"
    st = req.stat()
    os.utime(req, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert ingest_needed(campaign)


def test_invalid_cell_json_is_skipped_with_reason(campaign: Path) -> None:
    cell = campaign / "cells" / "b2cpu" / "cell.json"
    data = json.loads(cell.read_text())
    data["config"]["tier"] = "ssd"
    cell.write_text(json.dumps(data))
    shutil.rmtree(campaign / "cells" / "b1gpu" / "metrics")
    (campaign / "cells" / "b1gpu" / "cell.json").unlink()
    ingest_campaign(campaign)
    t = load_tables(campaign)
    assert sorted(t.cells["cell_id"]) == ["a1gpu", "a2cpu", "a3nvme"]
    reasons = {s["cell_id"]: s["reason"] for s in t.skipped}
    assert "config.tier" in reasons["b2cpu"] and "cell.json" in reasons["b2cpu"]
    assert "missing" in reasons["b1gpu"]


def test_requests_with_numeric_ids_and_missing_optional_fields(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    base = {"schema": 1, "chunk": 0, "round": 1, "prompt_tokens": 10}
    rows = [
        base
        | {"user_id": 7, "session_id": 3, "request_id": "r1", "t_start": 1.0, "ttft_s": 0.5}
        | {"latency_s": 2.0, "tpot_s": 0.1, "completion_tokens": 5, "status": "ok", "http_status": 200},
        base
        | {"user_id": 8, "session_id": 4, "request_id": "r2", "t_start": 2.0, "ttft_s": None}
        | {"latency_s": 3.0, "tpot_s": None, "completion_tokens": 0, "cached_tokens": 0, "status": "timeout"}
        | {"http_status": None, "error": "timed out", "replica": None},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = read_requests(path).to_pylist()
    assert [r["user_id"] for r in t] == ["7", "8"]
    assert t[0]["cached_tokens"] is None and t[0]["error"] is None
    assert t[1]["status"] == "timeout" and t[1]["ttft_s"] is None


def test_unknown_request_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"schema": 99, "user_id": "u", "round": 1, "status": "ok"}) + "\n")
    with pytest.raises(UserError, match="schema"):
        read_requests(path)


def test_sample_labels_with_quotes_and_backslashes_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    odd = {"path": 'C:\\dir "x"', "le": "+Inf"}
    lines = [
        {"ts": 1.0, "target": "t", "name": "a", "labels": odd, "value": 1.0},
        {"ts": 2.0, "target": "t", "name": "b", "labels": {}, "value": None},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = read_samples(path).to_pylist()
    assert json.loads(table[0]["labels"]) == odd
    assert table[1]["labels"] == "{}" and table[1]["value"] is None


def test_broken_sample_line_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.jsonl"
    path.write_text('{"ts": 1.0, "target": "t", "name": "a", "labels": {}, "value": 1.0}\n{"ts": 2.0, "tar\n')
    with pytest.raises(UserError, match=r"vllm-0\.jsonl"):
        read_samples(path)


def test_last_line_cut_off_by_a_killed_writer_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.jsonl"
    whole = [
        {"ts": float(i), "target": "t", "name": "a", "labels": {"k": "v"}, "value": float(i)} for i in (1, 2)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in whole) + '{"ts": 3.0, "target": "t", "na')
    table = read_samples(path).to_pylist()
    assert [r["value"] for r in table] == [1.0, 2.0]
    assert table[0]["labels"] == '{"k":"v"}'
