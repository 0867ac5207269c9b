"""Sequential write and read throughput of the drive behind a directory (the nvme tier's L2 path).

Writes a scratch file in chunk-sized blocks, syncs it, reads it back, and removes it. Uses O_DIRECT
where the filesystem accepts it, so the page cache neither absorbs writes nor serves reads; elsewhere
(tmpfs, some overlays) it falls back to buffered IO with fsync and a page-cache drop, and says so in
the result. Needs no GPU and no torch. It must never touch anything but its own scratch file.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import statistics
import time
from pathlib import Path

from kvoffload.calibrate.raw import DiskResult
from kvoffload.errors import UserError

log = logging.getLogger(__name__)

ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def filesystem_of(path: Path) -> str:
    """'<fstype> on <source>' of the mount holding `path`, from /proc/mounts ('unknown' elsewhere)."""
    target = str(path.resolve())
    best = ("", "unknown", "unknown")
    try:
        lines = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        source, mount_point, fstype = fields[0], fields[1].replace("\\040", " "), fields[2]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0]):
            best = (mount_point, fstype, source)
    return f"{best[1]} on {best[2]} (mounted at {best[0] or '?'})"


class _DirectUnsupported(Exception):
    """The filesystem refused O_DIRECT for this file."""


def _write_file(path: Path, block: mmap.mmap, blocks: int, direct: bool) -> float:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (_O_DIRECT if direct else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if direct and exc.errno == errno.EINVAL:
            raise _DirectUnsupported from exc
        raise
    try:
        view = memoryview(block)
        start = time.perf_counter()
        for _ in range(blocks):
            pos = 0
            while pos < len(view):
                try:
                    pos += os.write(fd, view[pos:])
                except OSError as exc:
                    if direct and exc.errno == errno.EINVAL:
                        raise _DirectUnsupported from exc
                    raise
        os.fsync(fd)
        elapsed = time.perf_counter() - start
        view.release()
    finally:
        os.close(fd)
    return elapsed


def _read_file(path: Path, block: mmap.mmap, total: int, direct: bool) -> float:
    fd = os.open(path, os.O_RDONLY | (_O_DIRECT if direct else 0))
    try:
        if not direct and hasattr(os, "posix_fadvise"):
            # Drop the clean pages the write left behind so the read comes from the drive.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        offset = 0
        start = time.perf_counter()
        while offset < total:
            got = os.preadv(fd, [block], offset)
            if got <= 0:
                raise OSError(errno.EIO, f"short read at offset {offset} of {path}")
            offset += got
        return time.perf_counter() - start
    finally:
        os.close(fd)


def measure_disk(
    directory: Path, total_bytes: int, block_bytes: int, repeats: int = 3, prefer_direct: bool = True
) -> DiskResult:
    """Median sequential write (with fsync) and read throughput of `directory`'s drive, in GB/s.

    `prefer_direct=False` skips O_DIRECT (what happens anyway where the filesystem refuses it).
    """
    if not directory.is_dir():
        raise UserError(f"--disk-dir {directory}: not a directory; give a directory on the drive to measure")
    if not os.access(directory, os.W_OK):
        raise UserError(f"--disk-dir {directory}: not writable; give a directory you can write to")
    if repeats < 1:
        raise UserError(f"disk repeats {repeats}: must be at least 1")
    block_bytes = _round_up(block_bytes, ALIGN)
    blocks = max(1, -(-total_bytes // block_bytes))
    total = blocks * block_bytes
    scratch = directory / f".kvoffload-calibrate-{os.getpid()}.bin"
    notes: list[str] = []
    block = mmap.mmap(-1, block_bytes)  # anonymous maps are page aligned, as O_DIRECT needs
    try:
        block.write(os.urandom(min(block_bytes, 1 << 20)) * (block_bytes // min(block_bytes, 1 << 20)))
        direct = prefer_direct and bool(_O_DIRECT)
        writes: list[float] = []
        reads: list[float] = []
        try:
            for _ in range(repeats):
                writes.append(_write_file(scratch, block, blocks, direct))
        except _DirectUnsupported:
            direct = False
            writes = [_write_file(scratch, block, blocks, False) for _ in range(repeats)]
        if not direct:
            notes.append(
                f"O_DIRECT {'refused by this filesystem' if prefer_direct else 'not asked for'}: "
                "buffered writes timed through fsync, reads after "
                "POSIX_FADV_DONTNEED (the page cache may still serve part of them)"
            )
        reads = [_read_file(scratch, block, total, direct) for _ in range(repeats)]
    finally:
        block.close()
        scratch.unlink(missing_ok=True)
    write_s = statistics.median(writes)
    read_s = statistics.median(reads)
    result = DiskResult(
        method=(
            f"one {total} B scratch file in {block_bytes} B blocks, "
            f"{'O_DIRECT' if direct else 'buffered'} sequential write + fsync then sequential read, "
            f"{repeats} runs each, median"
        ),
        path=str(directory.resolve()),
        filesystem=filesystem_of(directory),
        o_direct=direct,
        block_bytes=block_bytes,
        total_bytes=total,
        write_runs_s=writes,
        read_runs_s=reads,
        write_gbps=total / write_s / 1e9,
        read_gbps=total / read_s / 1e9,
        notes=notes,
    )
    log.info(
        "disk %s: write %.2f GB/s, read %.2f GB/s (%s)",
        directory,
        result.write_gbps,
        result.read_gbps,
        "O_DIRECT" if direct else "buffered",
    )
    return result
