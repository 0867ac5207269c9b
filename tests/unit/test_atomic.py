"""The one atomic writer: whole file or nothing, synced before the rename and the folder after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvoffload import atomic
from kvoffload.atomic import atomic_path, write_text_atomic


def test_replaces_whole_with_mode_0644_and_syncs_file_then_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if Path(f"/proc/self/fd/{fd}").is_dir() else "file")
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    write_text_atomic(path, "new")
    assert path.read_text() == "new" and (path.stat().st_mode & 0o777) == 0o644
    assert synced == ["file", "dir"]
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]
