"""`run --watch`: the live page (`kvoffload-lab watch`) as a process of its own beside a campaign run.

Orchestration layer, below the CLI: `run` starts it before the campaign and stops it after; the page
process (kvoffload/cli/watch.py) only reads the results folder, so the run never waits for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kvoffload.errors import UserError


class Beside:
    """`kvoffload-lab watch` started beside a run (`run --watch`): its URL, and its end."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_beside(results_dir: Path, bind: str, port: int) -> Beside:
    """Start the page as a process of its own, at a lower priority, that ends with this one; return
    once it serves (its first line is the URL)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "kvoffload.cli.main", "watch", str(results_dir), "--bind", bind]
    argv += ["--port", str(port), "--parent", str(os.getpid())]
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,  # Ctrl-C stops the run, which then stops the page
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("http://"):
            proc.wait(timeout=10)
            errors.seek(0)
            raise UserError(
                f"run --watch: the page did not start on {bind}:{port}: {errors.read().strip()[-400:]} "
                "(run's flags for it: --watch-bind, --watch-port; --watch-port 0 takes any free port)"
            )
    return Beside(proc, line)
