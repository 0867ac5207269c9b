"""Starting and stopping real local server processes for tests, bounded in time, always torn down."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM a process started with start_new_session=True and its children; SIGKILL after grace_s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pids_with_environ(needle: str) -> list[int]:
    """PIDs of this machine's processes whose environment holds `needle` (e.g. a test's own artifact
    folder, which ansible-runner hands every process of a run in AWX_ISOLATED_DATA_DIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle.encode() in environ:
            found.append(int(entry.name))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def sse_server(*args: str, timeout: float = 20.0, script: Path | None = None) -> Iterator[str]:
    """Run tests/support/sse_server.py (or `script`, which prints `PORT <n>` the same way) on a free
    loopback port; yield its base URL."""
    proc = subprocess.Popen(
        [sys.executable, str(script or ROOT / "tests/support/sse_server.py"), "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while not line.startswith("PORT ") and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("test server exited before it was ready")
            line = proc.stdout.readline()
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        stop_group(proc)
