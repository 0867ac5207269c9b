"""The replay's output records: one `RequestRecord` per request (requests.jsonl) and `SessionCounts`
(sessions.json). DESIGN.md section 6 is the contract; bump `SCHEMA` on any change of fields or meaning.
(sessions.json's `exceptions`, `stop_reason` and `first_error` were added without a bump: readers of
sessions.json ignore keys they do not know, and requests.jsonl, which shares `SCHEMA`, did not change.)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

SCHEMA = 1
Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request, as measured by the client (times in seconds, monotonic except t_start)."""

    user_id: str
    session_id: str
    chunk: int
    round: int
    request_id: str
    t_start: float
    ttft_s: float | None
    latency_s: float | None
    tpot_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    status: Status
    http_status: int | None
    error: str | None
    replica: str | None
    ttft_clock: str  # "kernel" (SO_TIMESTAMPNS) or "read" (when the client read it): see replay/client.py
    late_s: float | None  # set when the first token's read also took in a later one (its stamp may be late)
    schema: int = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


@dataclass
class SessionCounts:
    """What the replay achieved against what was asked: the basis of every comparison's validity.

    `error` counts sessions that ended on a failed request or on an exception of the replay client
    (`exceptions` counts the latter, each logged with its traceback). `stopped_by` is `pool`,
    `duration`, `interrupt`, `stall` (the stall watchdog) or `warmup` (every warm-up request failed);
    `stop_reason` says why in words for the last two, `first_error` is the first failure seen.
    """

    requested_concurrency: int
    num_rounds: int
    virtual_users_available: int
    dropped_by_isl: int = 0
    achieved_sessions: int = 0
    complete: int = 0
    incomplete: int = 0
    error: int = 0
    failed_requests: int = 0
    requests: int = 0
    exceptions: int = 0
    interrupted: bool = False
    stopped_by: str = "pool"
    stop_reason: str | None = None
    first_error: str | None = None
    duration_s: float = 0.0
    schema: int = SCHEMA

    @property
    def ok_requests(self) -> int:
        return self.requests - self.failed_requests

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class ResultsUnwritable(OSError):
    """A record could not be written (a full disk, a read-only file system): the run must stop."""


class RecordLog:
    """requests.jsonl, appended one whole line at a time.

    Each record is one `write` of its complete line; a write that fails or comes up short (ENOSPC
    part-way through) is undone by truncating the file back to its last whole line, then raises
    ResultsUnwritable. So the file only ever holds whole records, even on a full disk.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def append(self, record: RequestRecord) -> None:
        data = (record.to_json() + "\n").encode("utf-8")
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(28, os.strerror(28))  # a short write: the device filled up mid-line
        except OSError as exc:
            os.ftruncate(self._fd, self._size)
            raise ResultsUnwritable(exc.errno, f"cannot write {self.path}: {exc.strerror}") from exc
        self._size += written

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> RecordLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
