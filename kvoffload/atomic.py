"""Writing a whole file or nothing: a hidden temporary file in the same folder, fsync, rename.

A reader (ingest, node-exporter's textfile collector, a resumed campaign) never sees half a file, and
a write that fails (a full disk) leaves the previous version in place and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

FILE_MODE = 0o644


def write_text_atomic(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Replace `path` with `text`; OSError (with the temporary file removed) when it cannot."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)  # mkstemp creates 0600; readers may run as another user
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
