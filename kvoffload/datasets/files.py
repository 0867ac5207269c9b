"""Reading dataset files: which files of a folder are data, and JSON/JSONL/parquet rows with locations.

Every row comes with a location string (`line 12`, `row 3`) so that loaders can name the exact record in
their errors. Nothing here knows a dataset schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvoffload.datasets.chat import message_problem
from kvoffload.datasets.errors import data_error

NOT_DATA = {"license", "license.md", "license.txt", "readme", "readme.md", "source.md", "notice"}


def data_files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """`path` itself, or the data files of a folder (sorted; LICENSE, README, SOURCE.md skipped)."""
    if not path.exists():
        raise data_error(path, "path", "does not exist", "give a dataset file or folder")
    if path.is_file():
        return [path]
    files = [
        p
        for p in sorted(path.iterdir())
        if p.is_file()
        and not p.name.startswith(".")
        and p.name.lower() not in NOT_DATA
        and p.suffix.lower() in suffixes
    ]
    if not files:
        raise data_error(path, "folder", f"holds no data files ({', '.join(suffixes)})")
    return files


def _loads(path: Path, where: str, text: str) -> Any:
    """`json.loads`, with errors as `UserError`s naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = f"line {exc.lineno}" if where == "file" else where
        # json's "Invalid control character at" expects its own ": line L column C" after it.
        problem = exc.msg.removesuffix(" at")
        raise data_error(path, line, f"invalid JSON ({problem} at column {exc.colno})") from None
    except RecursionError:
        raise data_error(path, where, "invalid JSON (nested too deeply to read)") from None


def _decode(path: Path, where: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        newline = b"\n"
        if where == "file":
            where = f"line {data.count(newline, 0, exc.start) + 1}"
        column = exc.start - data.rfind(newline, 0, exc.start)
        raise data_error(
            path, where, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column})"
        ) from None


def jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, parsed object) for every non-empty line; bad JSON or bad UTF-8 raises naming the line."""
    seen = False
    # Lines are decoded one by one, so that a bad byte is blamed on its own line.
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"line {lineno}"
            line = _decode(path, where, raw)
            if not line.strip():
                continue
            seen = True
            yield where, _loads(path, where, line.rstrip("\r\n"))
    if not seen:
        raise data_error(path, "file", "is empty")


def parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row dict) for every parquet row, read in record batches to bound memory."""
    import pyarrow.parquet as pq  # lazily: only parquet datasets need it

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise data_error(path, "file", f"is not a readable parquet file ({exc})") from None
    n = 0
    batches = pf.iter_batches(batch_size=256)
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:  # a corrupt page shows only when it is read
            raise data_error(path, f"after row {n}", f"is not a readable parquet file ({exc})") from None
        if batch is None:
            break
        for row in batch.to_pylist():
            n += 1
            yield f"row {n}", row
    if n == 0:
        raise data_error(path, "file", "holds no rows")


def json_document(path: Path) -> Any:
    """A whole JSON file; bad JSON or bad UTF-8 raises naming the line."""
    text = _decode(path, "file", path.read_bytes())
    if not text.strip():
        raise data_error(path, "file", "is empty")
    return _loads(path, "file", text)


def check_messages(path: Path, where: str, value: Any, key: str = "messages") -> tuple[dict[str, Any], ...]:
    """An OpenAI messages list: a non-empty list of objects, each with a string `role`, each one a chat
    server accepts (kvoffload/datasets/chat.py)."""
    if not isinstance(value, list) or not value:
        raise data_error(path, where, f"'{key}' must be a non-empty list of messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise data_error(path, where, f"'{key}[{i}]' must be an object with a string 'role'")
    for i, message in enumerate(value):
        problem = message_problem(message)
        if problem:
            raise data_error(path, where, f"'{key}[{i}]': {problem}")
    return tuple(value)


def optional_int(path: Path, where: str, row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise data_error(path, where, f"'{key}' must be a non-negative integer, got {value!r}")
    return value


def optional_float(path: Path, where: str, row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise data_error(path, where, f"'{key}' must be a non-negative number of seconds, got {value!r}")
    return float(value)


def required_str(path: Path, where: str, row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value:
        raise data_error(path, where, f"missing or non-string '{key}'")
    return value
