"""Writing a whole file or nothing: a hidden temporary file in the same folder, fsync, rename, fsync.

A reader (ingest, node-exporter's textfile collector, a resumed campaign) never sees half a file, a
write that fails (a full disk) leaves the previous version in place and no temporary file behind, and
after a crash the file is either the old or the new one (the data is synced before the rename, the
folder after it). The one helper for this in the package: writers of text use `write_text_atomic`,
writers that need a path (parquet, tar) write into `atomic_path`'s.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILE_MODE = 0o644


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path, mode: int = FILE_MODE) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on a clean exit it is synced and renamed over `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(mode)  # mkstemp creates 0600; readers may run as another user
        _fsync_file(tmp)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Replace `path` with `text`; OSError (with the temporary file removed) when it cannot."""
    with atomic_path(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
