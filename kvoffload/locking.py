"""An exclusive lock on a lock file, held for a block: two processes that build the same thing (the lab's
base image, the tiny model, a wheel) take turns instead of writing over each other.

A leaf module like `kvoffload.atomic`: the standard library only, no logging, no policy on where lock
files live (callers name them).
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_file` (created if missing, its folder must exist) for the block;
    waits while another process holds it. The kernel drops the lock if the holder dies."""
    with lock_file.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
