"""The doctor's node probe run as the playbook runs it: one copied file, the machine's python3, nothing of
this package importable. On a machine without a GPU (this one, the virtual lab) every GPU check says
skip "no GPU"; the L2 checks run on a real folder. The CUDA child answers cleanly without libcuda."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.doctor import probe

pytestmark = pytest.mark.integration

PROBE = Path(probe.__file__)
GPU_CHECKS = ("device_files", "driver", "fabric", "persistence_mode", "clocks", "pcie",
              "cuda_init", "pinned_memory", "cuda_ipc")  # fmt: skip


def _has_gpu() -> bool:
    return bool([d for d in probe.pci_devices() if d["gpu"]]) or Path("/proc/driver/nvidia/version").exists()


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: the 'no GPU' path is not what runs")
def test_probe_on_a_machine_without_gpu(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    shutil.copy(PROBE, script)
    l2 = tmp_path / "l2"
    l2.mkdir()
    out = tmp_path / "answer.json"
    done = subprocess.run(
        [sys.executable, "-I", str(script), "--l2-path", str(l2), "--io-mb", "4", "--l1-gb", "0.5",
         "--engine-python", str(tmp_path / "no-venv" / "python"), "--out", str(out)],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
    )  # fmt: skip
    answer = json.loads(done.stdout)
    assert json.loads(out.read_text()) == answer
    assert answer["gpu"] is False and answer["probe_version"] == probe.PROBE_VERSION
    checks = {c["name"]: c for c in answer["checks"]}
    for name in GPU_CHECKS:
        assert (checks[name]["status"], checks[name]["detail"]) == ("skip", "no GPU"), name
    assert checks["l2_direct_io"]["status"] == "ok"
    assert checks["l2_direct_io"]["facts"]["size_mb"] == 4
    assert checks["memory"]["facts"]["l1_bytes"] == 2**29
    assert checks["engine"]["status"] == "skip"
    assert checks["python"]["facts"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert list(l2.iterdir()) == []  # the throughput probe's file is gone
    assert {c["status"] for c in answer["checks"]} <= set(probe.STATUSES)
    # the same checks, in the same order, as the probe answered on a real H200 (tests/fixtures/doctor)
    # (the 2026-12-05 recording: the probe's record gained `unit_toolchain` then, issue 41)
    h200 = json.loads((Path(__file__).parents[1] / "fixtures/doctor/h200/probe-flashinfer.json").read_text())
    assert [c["name"] for c in answer["checks"]] == [c["name"] for c in h200["checks"]]
    assert set(answer) == set(h200)


def test_cuda_child_without_libcuda_answers(tmp_path: Path) -> None:
    """The CUDA child (source on stdin, as the probe starts it) reports a missing libcuda as a failed
    init, and its forked IPC peer exits with it (the call returns)."""
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    answer = probe.run_cuda_child([], PROBE.read_text(), 1 << 20, 1 << 20)
    assert "died" not in answer
    assert answer["init"]["ok"] is False and "libcuda.so.1" in answer["init"]["error"]
