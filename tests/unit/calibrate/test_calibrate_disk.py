"""Disk throughput measurement on a temporary directory (real IO, small sizes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.calibrate.disk import filesystem_of, measure_disk
from kvoffload.errors import UserError


@pytest.mark.parametrize("prefer_direct", [True, False])
def test_measures_and_removes_its_scratch_file(tmp_path: Path, prefer_direct: bool) -> None:
    result = measure_disk(
        tmp_path, total_bytes=3 << 20, block_bytes=1 << 20, repeats=2, prefer_direct=prefer_direct
    )
    assert list(tmp_path.iterdir()) == []
    assert result.total_bytes == 3 << 20
    assert result.block_bytes == 1 << 20
    assert len(result.write_runs_s) == 2
    assert len(result.read_runs_s) == 2
    median_write = sorted(result.write_runs_s)[0] / 2 + sorted(result.write_runs_s)[1] / 2
    assert result.write_gbps == pytest.approx(result.total_bytes / median_write / 1e9)
    assert result.read_gbps > 0
    assert result.path == str(tmp_path.resolve())
    if not prefer_direct:
        assert result.o_direct is False
        assert any("not asked for" in note for note in result.notes)
    assert ("O_DIRECT" in result.method) == result.o_direct


def test_rounds_blocks_to_the_o_direct_alignment(tmp_path: Path) -> None:
    result = measure_disk(tmp_path, total_bytes=10_000, block_bytes=5_000, repeats=1)
    assert result.block_bytes == 8192
    assert result.total_bytes == 16384


def test_keeps_files_it_did_not_write(tmp_path: Path) -> None:
    keep = tmp_path / "data.bin"
    keep.write_bytes(b"x" * 10)
    measure_disk(tmp_path, total_bytes=1 << 20, block_bytes=1 << 20, repeats=1)
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]
    assert keep.read_bytes() == b"x" * 10


def test_missing_directory_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--disk-dir .*nope: not a directory"):
        measure_disk(tmp_path / "nope", total_bytes=1 << 20, block_bytes=1 << 20)


def test_filesystem_of_names_a_mount() -> None:
    if not Path("/proc/mounts").exists():
        pytest.skip("no /proc/mounts on this system")
    assert " on " in filesystem_of(Path("/"))
