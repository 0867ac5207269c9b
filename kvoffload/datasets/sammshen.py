"""Loader for `sammshen/lmcache-agentic-traces` (dataset code `sammshen`).

Two shapes are accepted, from parquet or JSONL:
- the Hugging Face schema, one row per call: `session_id, model, input (cumulative messages), pre_gap,
  output_length`;
- the third-party re-shaped sample: `{"model", "messages", "metadata": {"session_id", "request_index",
  "output_length"}}` (no `pre_gap`: it is 0).
Rows are contiguous per session in turn order; sessions are split where an input does not extend the
previous one (see split.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvoffload.datasets.errors import data_error
from kvoffload.datasets.files import (
    check_messages,
    data_files,
    jsonl_rows,
    optional_float,
    optional_int,
    parquet_rows,
    required_str,
)
from kvoffload.datasets.model import Call, Session
from kvoffload.datasets.split import split_sessions


def _call(path: Path, where: str, row: Any, index: int) -> Call:
    if not isinstance(row, dict):
        raise data_error(path, where, "must be a JSON object")
    if "metadata" in row:
        meta = row["metadata"]
        if not isinstance(meta, dict):
            raise data_error(path, where, "'metadata' must be an object")
        return Call(
            session_id=required_str(path, where, meta, "session_id"),
            index=index,
            messages=check_messages(path, where, row.get("messages")),
            output_length=optional_int(path, where, meta, "output_length"),
            pre_gap=0.0,
            source=f"{path.name}:{where}",
        )
    if "input" not in row:
        raise data_error(
            path,
            where,
            "missing 'input'",
            "expected the sammshen schema: session_id, input, pre_gap, output_length",
        )
    return Call(
        session_id=required_str(path, where, row, "session_id"),
        index=index,
        messages=check_messages(path, where, row.get("input"), key="input"),
        output_length=optional_int(path, where, row, "output_length"),
        pre_gap=optional_float(path, where, row, "pre_gap"),
        source=f"{path.name}:{where}",
    )


def load(path: Path) -> list[Session]:
    calls: list[Call] = []
    for file in data_files(path, (".jsonl", ".json", ".parquet")):
        rows = parquet_rows(file) if file.suffix.lower() == ".parquet" else jsonl_rows(file)
        calls.extend(_call(file, where, row, len(calls)) for where, row in rows)
    return split_sessions(calls)
