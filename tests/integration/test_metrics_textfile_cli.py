"""`kvoffload-lab metrics gpu-textfile` as a real process, with a fake nvidia-smi first on PATH.

Integration tier (each test runs the CLI as a child process); the renderer itself is tested in
tests/unit/metrics/test_metrics_textfile.py, whose helpers these reuse.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvoffload.metrics.gpu import parse_nvidia_smi_csv
from kvoffload.metrics.textfile import UP_METRIC
from tests.unit.metrics.test_metrics_textfile import H200_CAPTURE, _expected, _series_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "kvoffload.cli.main", "metrics", "gpu-textfile")


def _fake_tool(folder: Path, body: str) -> dict[str, str]:
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_cli_once_with_a_fake_nvidia_smi(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path / "bin", f"exec cat {H200_CAPTURE}")
    out = tmp_path / "kvoffload_gpu.prom"
    result = _cli("--tool", "nvidia-smi", "--output", str(out), "--once", env=env)
    assert result.returncode == 0, result.stderr
    assert f"4 GPU series written to {out}" in result.stdout
    last = parse_nvidia_smi_csv(H200_CAPTURE.read_text().splitlines()[-1], "t", 0.0)
    assert _series_of(out.read_text()) == _expected(last, "nvidia-smi", 1.0)
    assert out.stat().st_mode & 0o777 == 0o644


def test_cli_once_with_a_failing_tool_exits_1_and_writes_no_gpu_series(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    out = tmp_path / "kvoffload_gpu.prom"
    out.write_text('gpu_power_watts{gpu="0"} 700\n')  # stale values from an earlier run
    result = _cli("--tool", "nvidia-smi", "--output", str(out), "--once", env=env)
    assert result.returncode == 1
    assert "nvidia-smi exited 9: NVIDIA-SMI has failed" in result.stdout
    assert _series_of(out.read_text()) == {(UP_METRIC, (("tool", "nvidia-smi"),)): 0.0}


def test_cli_refuses_an_output_node_exporter_would_not_read(tmp_path: Path) -> None:
    env = dict(os.environ)
    result = _cli("--tool", "nvidia-smi", "--output", str(tmp_path / "gpu.txt"), "--once", env=env)
    assert result.returncode == 2
    assert "must end in .prom" in result.stderr
    result = _cli("--tool", "nvidia-smi", "--output", str(tmp_path / "no" / "gpu.prom"), env=env)
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_cli_loop_exits_0_on_sigterm_and_removes_the_file(tmp_path: Path) -> None:
    env = _fake_tool(tmp_path / "bin", f"exec sed -n 8p {H200_CAPTURE}")
    out = tmp_path / "kvoffload_gpu.prom"
    proc = subprocess.Popen(
        [*CLI, "--tool", "nvidia-smi", "--output", str(out), "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert out.exists(), proc.stderr.read() if proc.poll() is not None and proc.stderr else "no file"
        series = _series_of(out.read_text())
        assert [v for (name, _), v in series.items() if name == "gpu_power_watts"] == [694.82]
        time.sleep(0.5)  # a few more polls
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "polls written" in stdout and "file removed" in stdout
    assert not out.exists()
