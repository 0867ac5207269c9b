"""What the virtual-lab tests share: their pytest marks and running the CLI as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lab_marks(timeout_s: int) -> list[pytest.MarkDecorator]:
    """Marks of a lab test: `lab`, a timeout, and skips where the machine cannot run a lab."""
    return [
        pytest.mark.lab,
        pytest.mark.timeout(timeout_s),
        pytest.mark.skipif(
            os.geteuid() != 0, reason="the virtual lab needs root (nspawn, bridge, loop device)"
        ),
        pytest.mark.skipif(
            shutil.which("systemd-nspawn") is None or shutil.which("debootstrap") is None,
            reason="systemd-nspawn or debootstrap missing (apt-get install systemd-container debootstrap)",
        ),
    ]


def kvlab(env: dict[str, str], *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    """`kvoffload-lab ARGS` from the repository root, output captured, never raising on failure."""
    return subprocess.run(
        [sys.executable, "-m", "kvoffload.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
