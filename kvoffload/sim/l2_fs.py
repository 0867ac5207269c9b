"""The simulated `fs` / `fs_native` L2 adapter: one real file per KV chunk under `base_path`, scaled down.

A chunk of `n` modelled bytes is written as a file of `ceil(n / scale / 4096) * 4096` bytes (at least
4 KiB) of random data, fsync'ed, then dropped from the page cache, so the drive really sees the writes
and later reads (node-exporter's disk counters for that device move) while a CI disk is not filled:
with the default scale of 64, an 8B-model chunk (32 MiB) becomes a 512 KiB file. Reads use O_DIRECT
when the filesystem allows it (tmpfs does not), otherwise a plain read after dropping the page cache,
whatever `use_odirect` says: a read served from the page cache would hide the disk from the metrics.
Usage, capacity (`max_capacity_gb`, GiB as in LMCache) and metrics count the modelled bytes, not the
file sizes. Files already under `base_path` at start-up are indexed (LMCache's lookups find chunks on
disk that an earlier run left); with `persist_enabled: false` the adapter deletes its files when the
server stops, as LMCache does. Files deleted from `base_path` while the server runs (a campaign wiping
L2 between cells) leave the index at the next `reconcile` (the cache server calls it once a second) or at
the first read that finds one gone, whichever comes first; a deleted folder is made again on the next
write. Files are named as LMCache's fs_native names them (`object_name`), so the same tools list and
delete them (`DELETE /cache/objects`, plugins/modules/kvoffload_l2_clear.py).

Blocking file IO runs in worker threads; callers await it. Timing (the modelled disk bandwidth) and
when to evict (the eviction block's watermark) are the cache server's business, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections import OrderedDict
from pathlib import Path

from kvoffload.sim.cache_args import FsAdapter

_ALIGN = 4096
_EXT = ".data"
_RANDOM = os.urandom(4 * 2**20)


def scaled_size(nbytes: int, scale: int) -> int:
    """File size standing for `nbytes` of KV: divided by `scale`, rounded up to 4 KiB."""
    return max(_ALIGN, -(-(nbytes // scale) // _ALIGN) * _ALIGN)


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _write(path: Path, tmp: Path, size: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileNotFoundError:  # the folder was deleted under the running server
        tmp.parent.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, 0o644)
    try:
        left = size
        while left > 0:
            n = min(left, len(_RANDOM))
            os.write(fd, _RANDOM[:n])
            left -= n
        os.fsync(fd)
        _drop_cache(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def _read(path: Path, size: int, direct: bool) -> int:
    flags = os.O_RDONLY
    if direct and hasattr(os, "O_DIRECT"):
        try:
            fd = os.open(path, flags | os.O_DIRECT)
        except OSError:
            fd = os.open(path, flags)
            direct = False
    else:
        fd = os.open(path, flags)
    try:
        if not direct:
            _drop_cache(fd)
        buf = mmap.mmap(-1, max(size, _ALIGN))  # page-aligned, as O_DIRECT requires
        try:
            total = 0
            while total < size:
                try:
                    n = os.preadv(fd, [memoryview(buf)[total:size]], total)
                except OSError:
                    if not direct:
                        raise
                    # Filesystem refused O_DIRECT for this read: fall back to buffered IO.
                    os.close(fd)
                    fd = os.open(path, os.O_RDONLY)
                    direct = False
                    _drop_cache(fd)
                    continue
                if n <= 0:
                    break
                total += n
            return total
        finally:
            buf.close()
    finally:
        os.close(fd)


def _keys_on_disk(base: Path) -> set[str]:
    try:
        return {_key_of(entry.name) for entry in base.iterdir() if entry.name.endswith(_EXT)}
    except FileNotFoundError:
        return set()


def _key_of(name: str) -> str:
    return name.removesuffix(_EXT).rsplit("@", 1)[-1]


def object_name(model: str, key: str) -> str:
    """fs_native's file name of a chunk: `<model, / as -SEP->@<kv_rank>@<object group>@<chunk hash>.data`
    (LMCache 0.5.6; the simulator has one rank and one group, and its hex key is the chunk hash)."""
    return f"{model.replace('/', '-SEP-')}@0x00000000@0@{key}{_EXT}"


class FsL2:
    """Index + files of one fs / fs_native adapter (see module docstring)."""

    def __init__(self, cfg: FsAdapter, scale: int) -> None:
        self.cfg = cfg
        self.name = cfg.type_name
        self.scale = scale
        self.base = Path(cfg.base_path)
        self.base.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = self.base / cfg.relative_tmp_dir if cfg.relative_tmp_dir else self.base
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = int(cfg.max_capacity_gb * 2**30)
        # key -> modelled bytes, least recently used first; key -> its file's name
        self.index: OrderedDict[str, int] = OrderedDict()
        self.files: dict[str, str] = {}
        self.used = 0
        self._written: set[str] = set()  # keys written while a reconcile lists the folder
        self._recover()

    def _recover(self) -> None:
        for path in sorted(self.base.glob(f"*{_EXT}")):
            key = _key_of(path.name)
            size = path.stat().st_size * self.scale
            self.index[key] = size
            self.files[key] = path.name
            self.used += size

    def path(self, key: str) -> Path:
        return self.base / self.files.get(key, object_name("", key))

    def __contains__(self, key: str) -> bool:
        return key in self.index

    @property
    def usage_fraction(self) -> float:
        """used / capacity, or -1 without a capacity (LMCache's "no eviction signal")."""
        return self.used / self.capacity_bytes if self.capacity_bytes > 0 else -1.0

    async def write(self, key: str, nbytes: int, model: str = "") -> None:
        self._written.add(key)
        self.files.setdefault(key, object_name(model, key))
        tmp = self.tmp_dir / f"{key}.tmp"
        await asyncio.to_thread(_write, self.path(key), tmp, scaled_size(nbytes, self.scale))
        if key not in self.index:
            self.used += nbytes
        else:
            self.used += nbytes - self.index[key]
        self.index[key] = nbytes
        self.index.move_to_end(key)

    async def read(self, key: str) -> int:
        """Read one chunk back; FileNotFoundError when it is gone (evicted meanwhile, or deleted)."""
        if key not in self.index:
            raise FileNotFoundError(self.path(key))
        nbytes = self.index[key]
        self.index.move_to_end(key)
        path = self.path(key)
        try:
            await asyncio.to_thread(_read, path, scaled_size(nbytes, self.scale), True)
        except FileNotFoundError:
            self.forget(key)
            raise
        return nbytes

    async def reconcile(self) -> list[str]:
        """Drop the chunks whose files are gone from `base_path` (deleted by hand); the keys dropped.

        The folder is listed in a worker thread; a chunk written meanwhile is kept, as its file may
        have been created after the listing.
        """
        self._written.clear()
        known = list(self.index)
        on_disk = await asyncio.to_thread(_keys_on_disk, self.base)
        gone = [k for k in known if k not in on_disk and k not in self._written and k in self.index]
        for key in gone:
            self.forget(key)
        return gone

    def forget(self, key: str) -> None:
        size = self.index.pop(key, None)
        self.files.pop(key, None)
        if size is not None:
            self.used -= size

    def delete(self, keys: list[str]) -> int:
        """Delete these chunks (LMCache's key-addressed delete, absent keys skipped); how many it held."""
        held = 0
        for key in keys:
            if key not in self.index:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()
            self.forget(key)
            held += 1
        return held

    def evict(self, count: int) -> list[str]:
        """Delete the `count` least recently used chunks (stored or loaded); the keys deleted."""
        evicted: list[str] = []
        while self.index and len(evicted) < count:
            key, size = self.index.popitem(last=False)
            self.used -= size
            with contextlib.suppress(FileNotFoundError):
                self.path(key).unlink()
            self.files.pop(key, None)
            evicted.append(key)
        return evicted

    def close(self) -> None:
        """At shutdown: keep the files (persist_enabled, the default) or delete them."""
        if not self.cfg.persist_enabled:
            self.evict(len(self.index))
