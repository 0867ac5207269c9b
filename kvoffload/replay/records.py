"""Writing the replay's records: requests.jsonl appended one whole line at a time.

The record and the session counts are defined once, in kvoffload/contracts/records.py (re-exported
here for the replay's modules); this module only writes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvoffload.contracts.records import SCHEMA, Measurement, RequestRecord, SessionCounts, Status

__all__ = [
    "SCHEMA",
    "Measurement",
    "RecordLog",
    "RequestRecord",
    "ResultsUnwritable",
    "SessionCounts",
    "Status",
]


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
