"""The request record and session counts: one model, written by the replay and read by ingest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from kvoffload.contracts.arrow import arrow_schema
from kvoffload.contracts.records import REQUEST_FIELDS, SCHEMA, Measurement, RequestRecord, SessionCounts
from kvoffload.ingest.cellmeta import load_session_counts
from kvoffload.ingest.jsonl import REQUEST_SCHEMA, read_requests
from kvoffload.ingest.tables import SESSIONS_JSON_ONLY, SESSIONS_SCHEMA
from kvoffload.replay.records import RecordLog

FIXTURE = Path(__file__).parents[2] / "fixtures" / "campaign-small"


def _record(**changes: object) -> RequestRecord:
    values: dict[str, object] = {
        "user_id": "u1",
        "session_id": "s1",
        "chunk": 0,
        "round": 2,
        "request_id": "r1",
        "t_start": 1800000000.5,
        "ttft_s": 0.25,
        "latency_s": 1.5,
        "tpot_s": 0.01,
        "prompt_tokens": 100,
        "completion_tokens": 32,
        "cached_tokens": 64,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "replica": "vllm-0",
        "ttft_clock": "kernel",
        "late_s": 0.003,
    }
    values.update(changes)
    return RequestRecord.model_validate(values)


def test_the_ingest_columns_are_the_record_fields() -> None:
    assert REQUEST_SCHEMA.names == list(REQUEST_FIELDS)
    assert set(REQUEST_FIELDS) == {"schema", *(n for n in RequestRecord.model_fields if n != "schema_")}
    assert REQUEST_SCHEMA.field("ttft_clock").type == pa.string()
    assert REQUEST_SCHEMA.field("late_s").type == pa.float64()
    assert REQUEST_SCHEMA.field("status").type == pa.string()  # a Literal of strings


def test_what_the_replay_writes_ingest_reads_back_field_for_field(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    written = [
        _record(),
        _record(request_id="r2", status="error", ttft_s=None, late_s=None, error="HTTP 500"),
        _record(
            request_id="r3",
            response_id="chatcmpl-93d271d214c75184",
            server_queue_s=0.002,
            server_ttft_s=0.04,
            vllm_cached_tokens=32,
            lmcache_cached_tokens=64,
            lmcache_loaded_tokens=32,
        ),
    ]
    with RecordLog(path) as log:
        for record in written:
            log.append(record)
    rows = read_requests(path).to_pylist()
    assert [RequestRecord.model_validate(row) for row in rows] == written
    assert rows[0]["schema"] == SCHEMA == 3
    assert rows[2]["lmcache_loaded_tokens"] == 32 and rows[0]["lmcache_loaded_tokens"] is None


def test_a_schema_2_record_reads_with_the_server_fields_null(tmp_path: Path) -> None:
    line = json.loads(_record().to_json())
    line["schema"] = 2
    for name in ("response_id", "server_queue_s", "server_ttft_s", "vllm_cached_tokens",
                 "lmcache_cached_tokens", "lmcache_loaded_tokens"):  # fmt: skip
        del line[name]
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(line) + "\n")
    row = read_requests(path).to_pylist()[0]
    assert row["schema"] == 2 and row["cached_tokens"] == 64
    assert row["response_id"] is None and row["server_ttft_s"] is None and row["vllm_cached_tokens"] is None


def test_a_schema_1_file_reads_with_the_defaults_of_the_new_fields(tmp_path: Path) -> None:
    old = (FIXTURE / "cells" / "a1gpu" / "requests.jsonl").read_text()
    assert "ttft_clock" not in old
    path = tmp_path / "requests.jsonl"
    path.write_text(old)
    table = read_requests(path)
    assert table.num_rows == len(old.splitlines())
    assert set(table["schema"].to_pylist()) == {1}
    assert set(table["ttft_clock"].to_pylist()) == {"read"}
    assert set(table["late_s"].to_pylist()) == {None}


def test_the_client_measurement_is_the_records_own_fields() -> None:
    measured = Measurement.model_validate(
        {k: v for k, v in _record().model_dump().items() if k in Measurement.model_fields}
    )
    record = RequestRecord(
        user_id="u1", session_id="s1", chunk=0, round=2, request_id="r1", **measured.model_dump()
    )
    assert record == _record()
    with pytest.raises(ValueError, match="status"):
        _record(status="fine")


def test_session_counts_round_trip_and_older_files_read(tmp_path: Path) -> None:
    counts = SessionCounts(requested_concurrency=4, num_rounds=3, virtual_users_available=9)
    counts.requests += 5
    counts.failed_requests += 1
    path = tmp_path / "sessions.json"
    path.write_text(counts.to_json())
    assert json.loads(path.read_text())["schema"] == SCHEMA
    back = load_session_counts(path)
    assert back == counts and back.ok_requests == 4
    old = load_session_counts(FIXTURE / "cells" / "a1gpu" / "sessions.json")
    assert old.schema_ == 1 and old.num_rounds == 0 and old.requested_concurrency > 0


def test_the_sessions_table_has_every_field_but_the_version_and_the_warmup_errors() -> None:
    kept = [n for n in SessionCounts.model_fields if n not in ("schema_", "warmup_errors")]
    assert SESSIONS_SCHEMA.names == ["cell_id", *kept]
    assert arrow_schema(SessionCounts, exclude=SESSIONS_JSON_ONLY).field("interrupted").type == pa.bool_()


def test_arrow_schema_refuses_an_order_that_misses_a_field() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        arrow_schema(RequestRecord, REQUEST_FIELDS[:-1])
