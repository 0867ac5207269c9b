"""Running host commands for the virtual lab: one checked runner and PID helpers.

Used by the lab modules only. Commands are argument lists (never a shell); failures become
`UserError` naming the command and its stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from kvoffload.errors import UserError

log = logging.getLogger(__name__)


def run(cmd: list[str], *, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `cmd`, capture its output; on failure (when `check`) raise `UserError` with its stderr."""
    log.debug("run: %s", " ".join(cmd))
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise UserError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def cmdline(pid: int) -> list[str]:
    """The argument vector of process `pid`, or [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_ours(pid: int, marker: str) -> bool:
    """True when `pid` is alive and its command line contains `marker` (guards against PID reuse)."""
    return marker in cmdline(pid)


def terminate(pid: int, marker: str, *, grace_s: float = 30.0) -> None:
    """SIGTERM `pid` if it is still ours, wait up to `grace_s`, then SIGKILL. No-op when it is gone."""
    if not is_ours(pid, marker):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_ours(pid, marker):
            return
        time.sleep(0.2)
    log.warning("pid %d did not stop within %.0f s of SIGTERM; sending SIGKILL", pid, grace_s)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(50):
        _reap(pid)
        if not is_ours(pid, marker):
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    """Collect `pid` if it is our own child (when down runs in the process that ran up)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
