"""Loader for generic JSONL traces (dataset code `generic`): one line per LLM call.

Each line: `session_id` (string), `messages` (the full OpenAI messages list of that call), optional
`output_length` (completion tokens) and `pre_gap` (seconds before the call). Lines of a session are in
turn order; sessions are split where an input does not extend the previous one. The messages are sent
as recorded, so a message a chat server would refuse (a role other than system, developer, user,
assistant or tool; content that is neither text nor content parts; a tool message without its
`tool_call_id`; see kvoffload/datasets/chat.py) is refused here, naming the file and the line.
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
    required_str,
)
from kvoffload.datasets.model import Call, Session
from kvoffload.datasets.split import split_sessions


def _call(path: Path, where: str, row: Any, index: int) -> Call:
    if not isinstance(row, dict):
        raise data_error(path, where, "must be a JSON object with session_id and messages")
    return Call(
        session_id=required_str(path, where, row, "session_id"),
        index=index,
        messages=check_messages(path, where, row.get("messages")),
        output_length=optional_int(path, where, row, "output_length"),
        pre_gap=optional_float(path, where, row, "pre_gap"),
        source=f"{path.name}:{where}",
    )


def load(path: Path) -> list[Session]:
    calls: list[Call] = []
    for file in data_files(path, (".jsonl",)):
        calls.extend(_call(file, where, row, len(calls)) for where, row in jsonl_rows(file))
    return split_sessions(calls)
