"""What the virtual-lab tests share: their pytest marks and running the CLI as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "data" / "tau2-bench" / "gpt-4.1_airline_default_gpt-4.1_1trials.json"


def small_campaign(name: str, tiers: list[str], **over: Any) -> dict[str, Any]:
    """A sim campaign for lab tests: 8 airline users x 5 rounds at concurrency 4, 16K tokens of GPU KV
    per replica (64 MiB on the tiny profile); `over` replaces or adds keys."""
    return {
        "name": name,
        "model": "tiny-llama",
        "gpu_vendor": "nvidia",
        "engine": "sim",
        "sim_profile": "tiny",
        "dataset": {"code": "tau2-bench-v1", "path": str(DATASET)},
        "tiers": tiers,
        "concurrency": [4],
        "num_rounds": [5],
        "isl": 16384,
        "osl": 16,
        "max_sessions": 8,
        "kv_cache_memory_bytes": 64 * 1024 * 1024,
        "extra_engine_args": ["--max-model-len", "16384"],
        **over,
    }


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


def kvlab(env: dict[str, str], *args: str, timeout: float = 3000) -> subprocess.CompletedProcess[str]:
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
