"""kvoffload.locking: the lock is held for the block, by this open of the file only, and let go after."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from kvoffload.locking import exclusive


def test_another_open_of_the_lock_file_waits_inside_the_block_and_not_after(tmp_path: Path) -> None:
    lock = tmp_path / ".build.lock"
    # flock belongs to an open file: a second open, even in this process, is another holder
    with exclusive(lock), lock.open("w") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with lock.open("w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_lock_is_let_go_when_the_block_raises(tmp_path: Path) -> None:
    lock = tmp_path / ".build.lock"
    with pytest.raises(RuntimeError), exclusive(lock):
        raise RuntimeError("the build failed")
    with lock.open("w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
