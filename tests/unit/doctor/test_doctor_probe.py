"""The node probe's parsers and verdicts, on outputs recorded on a real H200 host (tests/fixtures/doctor)
and on sysfs trees built in tmp_path. Nothing here needs a GPU or runs a command."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kvoffload.doctor import probe

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "doctor" / "h200"
SMI = (H200 / "nvidia-smi-q.txt").read_text()


def _gpus(text: str = SMI) -> list[dict[str, Any]]:
    return probe.smi_gpus(probe.parse_smi_q(text))


def _hgx(state: str) -> str:
    """The H200's output as an HGX board's GPU would report its fabric."""
    text = SMI.replace(
        "    Fabric\n        State                                          : N/A\n"
        "        Status                                         : N/A\n",
        f"    Fabric\n        State                                          : {state}\n"
        "        Status                                         : Success\n",
    )
    assert text != SMI
    return text


def test_smi_q_of_the_h200() -> None:
    parsed = probe.parse_smi_q(SMI)
    assert parsed["Driver Version"] == "580.159.04"
    assert parsed["CUDA Version"] == "13.0"
    [gpu] = _gpus()
    assert gpu == {
        "bus_id": "00000000:00:06.0",
        "name": "NVIDIA H200",
        "uuid": "GPU-54a3756b-f8b5-8f8a-ae78-49b925d8ed78",
        "persistence_mode": "Enabled",
        "fabric_state": "N/A",
        "fabric_status": "N/A",
        "clocks_sm_mhz": 345,
        "clocks_sm_max_mhz": 1980,
        "clocks_mem_mhz": 3201,
        "clocks_mem_max_mhz": 3201,
        "clock_event_reasons": [],  # only Idle is active, which is no slowdown
        "pcie_gen_current": 5,
        "pcie_gen_max": 5,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
    }


def test_driver_version_open_and_proprietary() -> None:
    assert probe.parse_driver_version((H200 / "proc-driver-nvidia-version.txt").read_text()) == {
        "version": "580.159.04",
        "open": True,
    }
    old = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    assert probe.parse_driver_version(old) == {"version": "535.104.05", "open": False}
    assert probe.parse_fm_version("Fabric Manager version is : 580.159.04\n") == "580.159.04"


def test_driver_verdicts() -> None:
    module = {"version": "580.159.04", "open": True}
    assert probe.verdict_driver(True, module, "580.159.04", "", True)["status"] == "ok"
    mismatch = probe.verdict_driver(True, module, "580.126.09", "", True)
    assert mismatch["status"] == "fail" and "580.126.09" in mismatch["detail"]
    no_uvm = probe.verdict_driver(True, module, "580.159.04", "", False)
    assert no_uvm["status"] == "fail" and "modprobe nvidia_uvm" in no_uvm["fix"]
    no_smi = probe.verdict_driver(
        True, module, None, "Failed to initialize NVML: Driver/library version mismatch", True
    )
    assert no_smi["status"] == "fail" and "version mismatch" in no_smi["detail"]
    assert probe.verdict_driver(False, None, None, "", False) == {
        "name": "driver",
        "status": "skip",
        "detail": "no GPU",
    }


def test_device_files(tmp_path: Path) -> None:
    char = Path("/dev/null").stat().st_mode
    (tmp_path / "f").touch()
    regular = (tmp_path / "f").stat().st_mode
    ok = probe.verdict_device_files(True, {"/dev/nvidiactl": char, "/dev/nvidia-uvm": char})
    assert ok["status"] == "ok"
    bad = probe.verdict_device_files(True, {"/dev/nvidiactl": char, "/dev/nvidia-uvm": None})
    assert bad["status"] == "fail"
    assert bad["detail"] == "/dev/nvidia-uvm (missing)" and "nvidia-modprobe -u" in bad["fix"]
    assert stat.S_ISREG(regular)
    odd = probe.verdict_device_files(True, {"/dev/nvidiactl": regular, "/dev/nvidia-uvm": char})
    assert odd["detail"] == "/dev/nvidiactl (not a character device)"
    assert probe.verdict_device_files(False, {})["status"] == "skip"


def test_fabric_h200_without_nvswitch_is_skipped() -> None:
    result = probe.verdict_fabric(True, _gpus(), 0, "580.159.04", None, None)
    assert (result["status"], result["detail"]) == ("skip", "no NVSwitch: no fabric to manage")


@pytest.mark.parametrize(
    ("state", "service", "fm", "status", "words"),
    [
        (
            "In Progress",
            "active",
            "580.159.04",
            "fail",
            "fabric not completed (00000000:00:06.0: In Progress)",
        ),
        (
            "Completed",
            "active",
            "580.126.09",
            "fail",
            "Fabric Manager 580.126.09 differs from driver 580.159.04",
        ),
        ("Completed", "failed", "580.159.04", "fail", "nvidia-fabricmanager is failed"),
        (
            "Completed",
            "active",
            "580.159.04",
            "ok",
            "fabric Completed on 1 GPU(s), 4 NVSwitch(es), service active",
        ),
        ("Completed", None, None, "ok", "service state unknown (no systemctl)"),
    ],
)
def test_fabric_on_hgx(state: str, service: str | None, fm: str | None, status: str, words: str) -> None:
    result = probe.verdict_fabric(True, _gpus(_hgx(state)), 4, "580.159.04", service, fm)
    assert result["status"] == status
    assert words in result["detail"]
    if status == "fail":
        assert "driver's exact version (580.159.04)" in result["fix"]


def test_fabric_with_nvswitches_but_na_state_fails() -> None:
    """NVSwitches present and the GPUs report no fabric: the fabric was never brought up."""
    result = probe.verdict_fabric(True, _gpus(), 6, "580.159.04", "inactive", None)
    assert result["status"] == "fail" and "N/A" in result["detail"]


def test_persistence_and_clocks() -> None:
    assert probe.verdict_persistence(True, _gpus())["status"] == "ok"
    off = _gpus(
        SMI.replace(
            "Persistence Mode                                   : Enabled",
            "Persistence Mode                                   : Disabled",
        )
    )
    assert probe.verdict_persistence(True, off)["status"] == "warn"
    clocks = probe.verdict_clocks(True, _gpus())
    assert clocks["status"] == "ok" and "SM max 1980 MHz" in clocks["detail"]
    hot = SMI.replace(
        "            HW Thermal Slowdown                        : Not Active",
        "            HW Thermal Slowdown                        : Active",
    )
    assert hot != SMI
    slow = probe.verdict_clocks(True, _gpus(hot))
    assert slow["status"] == "warn" and "HW Thermal Slowdown" in slow["detail"]


def test_pcie_width() -> None:
    [gpu] = _gpus()
    links = {gpu["bus_id"]: {"width": 16, "width_max": 16, "gen": 5, "gen_max": 5}}
    assert probe.verdict_pcie(True, links)["status"] == "ok"
    narrow = probe.verdict_pcie(True, {"0000:18:00.0": {"width": 8, "width_max": 16, "gen": 5, "gen_max": 5}})
    assert narrow["status"] == "warn" and "x8 of x16" in narrow["detail"]
    assert probe.verdict_pcie(False, {})["status"] == "skip"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _sysfs(root: Path) -> None:
    """Two sockets, an H200 on node 1, an NVSwitch, a NIC, and an NVMe (partition 1) on node 0."""
    pci = root / "sys/devices/pci0000:00"
    for bdf, vendor, klass, numa in [
        ("0000:18:00.0", "0x10de", "0x030200", "1"),
        ("0000:07:00.0", "0x10de", "0x068000", "0"),
        ("0000:31:00.0", "0x15b3", "0x020000", "0"),
    ]:
        dev = pci / bdf
        for name, value in [
            ("vendor", vendor),
            ("class", klass),
            ("numa_node", numa),
            ("current_link_width", "16"),
            ("max_link_width", "16"),
        ]:
            _write(dev / name, value)
        link = root / "sys/bus/pci/devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dev)
    nvme = pci / "0000:01:00.0"
    _write(nvme / "numa_node", "0")
    disk = nvme / "nvme/nvme0/nvme0n1"
    _write(disk / "queue/discard_max_bytes", "2199023255040")
    _write(disk / "queue/rotational", "0")
    _write(disk / "nvme0n1p1/partition", "1")
    (root / "sys/dev/block").mkdir(parents=True)
    (root / "sys/dev/block/259:1").symlink_to(disk / "nvme0n1p1")
    for node, cpus in [(0, "0-31,64-95"), (1, "32-63,96-127")]:
        _write(root / f"sys/devices/system/node/node{node}/cpulist", cpus)
        _write(root / f"sys/devices/system/node/node{node}/meminfo", f"Node {node} MemTotal:  1056000000 kB")


def test_sysfs_gpus_nvswitch_numa_and_nvme(tmp_path: Path) -> None:
    _sysfs(tmp_path)
    devices = probe.pci_devices(tmp_path)
    assert [(d["bdf"], d["gpu"], d["nvswitch"], d["numa_node"]) for d in devices] == [
        ("0000:07:00.0", False, True, 0),
        ("0000:18:00.0", True, False, 1),
    ]
    assert probe.numa_layout(tmp_path) == [
        {"node": 0, "cpus": 64, "mem_total": 1056000000 * 1024},
        {"node": 1, "cpus": 64, "mem_total": 1056000000 * 1024},
    ]
    dev = probe.block_device(os.makedev(259, 1), tmp_path)
    assert dev == {
        "name": "nvme0n1p1",
        "disk": "nvme0n1",
        "discard_max_bytes": 2199023255040,
        "rotational": "0",
        "numa_node": 0,
    }
    assert probe.block_device(os.makedev(0, 45), tmp_path) is None  # btrfs, overlay: no block device
    assert probe.verdict_trim(dev, "xfs")["status"] == "ok"
    assert probe.verdict_trim({**dev, "discard_max_bytes": 0}, "xfs")["status"] == "warn"
    assert (
        probe.verdict_trim(None, "tmpfs")["detail"]
        == "no block device behind the L2 mount (tmpfs file system)"
    )
    numa = probe.verdict_numa(True, probe.numa_layout(tmp_path), {"0000:18:00.0": 1}, 0)
    assert numa["status"] == "ok"
    assert numa["detail"] == "2 NUMA node(s); GPUs: 0000:18:00.0 on 1; NVMe on 0"
    hidden = probe.verdict_numa(True, probe.numa_layout(tmp_path), {"0000:18:00.0": -1}, 0)
    assert hidden["status"] == "warn"


def test_memory_for_l1() -> None:
    mem = probe.parse_meminfo((H200 / "meminfo.txt").read_text())
    assert mem["MemAvailable"] == 131432000 * 1024
    assert probe.verdict_memory(mem, 64)["status"] == "ok"
    assert probe.verdict_memory(mem, 110)["status"] == "warn"  # over 4/5 of 125.3 GiB
    too_big = probe.verdict_memory(mem, 200)
    assert too_big["status"] == "fail" and "200 GiB does not fit in 125.3 GiB" in too_big["detail"]
    assert probe.verdict_memory(mem, None)["detail"] == "125.3 GiB available; no L1 asked for"


def test_mountinfo() -> None:
    text = (
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,discard\n"
        "40 22 259:1 / /mnt/kvoffload\\040nvme rw,noatime shared:20 - xfs /dev/nvme0n1p1 rw,attr2\n"
        "41 22 0:30 / /mnt/kvoffload\\040nvme/tmp rw shared:21 - tmpfs tmpfs rw\n"
    )
    mounts = probe.parse_mountinfo(text)
    assert [m["point"] for m in mounts] == ["/", "/mnt/kvoffload nvme", "/mnt/kvoffload nvme/tmp"]
    assert probe.mount_of("/mnt/kvoffload nvme/l2", mounts)["fstype"] == "xfs"  # type: ignore[index]
    assert probe.mount_of("/mnt/kvoffload nvme/tmp/x", mounts)["fstype"] == "tmpfs"  # type: ignore[index]
    assert probe.mount_of("/mnt/kvoffload", mounts)["fstype"] == "ext4"  # type: ignore[index]


def test_cuda_verdicts() -> None:
    assert [c["status"] for c in probe.verdict_cuda(False, None, None, "")] == ["skip"] * 3
    inside = {"init": {"ok": False, "error": "cuInit: CUDA_ERROR_UNKNOWN (999)"}}
    outside = {"init": {"ok": True, "devices": ["NVIDIA H200"]}}
    init, pinned, ipc = probe.verdict_cuda(True, inside, outside, "")
    assert init["status"] == "fail" and "works outside the sandbox" in init["detail"]
    assert "nvidia-modprobe -u" in init["fix"]
    assert (pinned["status"], ipc["status"]) == ("skip", "skip")
    good = {
        "uid": 998,
        "no_new_privs": 1,
        "init": {"ok": True, "devices": ["NVIDIA H200"], "cuda_driver_version": 13000},
        "pinned": {"ok": True, "bytes": 2**32, "register_s": 2.1, "h2d_gb_s": 55.1, "d2h_gb_s": 55.0},
        "ipc": {"ok": False, "error": "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_CONTEXT (201)"},
    }
    init, pinned, ipc = probe.verdict_cuda(True, good, None, "")
    assert init["status"] == "ok" and "unit-like sandbox" in init["detail"]
    assert init["facts"]["no_new_privs"] == 1
    assert pinned["detail"] == "4.00 GiB registered in 2.1 s; GPU 0 copies h2d 55.1 GB/s, d2h 55.0 GB/s"
    assert ipc["status"] == "fail" and "INVALID_CONTEXT" in ipc["detail"]
    # the two processes of the check share user, /dev/shm and PID namespace: the fix points at the GPU
    # first, then names what the units must keep (and PrivateTmp=, which they set, as harmless)
    assert ipc["fix"].startswith("two processes of one user in one sandbox could not share a GPU buffer")
    assert "(torch's IPC files in /dev/shm are mode 0600)" in ipc["fix"]
    shm = "no PrivateIPC=, PrivateDevices= or private mount of /dev/shm; PrivateTmp= leaves it alone"
    assert shm in ipc["fix"]
    [plain_init, *_] = probe.verdict_cuda(True, None, outside, "no systemd-run")
    assert plain_init["detail"] == "1 device(s) in a child process (no sandbox: no systemd-run)"


def test_python_versions() -> None:
    assert probe.verdict_python((3, 10, 12))["status"] == "fail"
    assert probe.verdict_python((3, 12, 3))["status"] == "ok"


def test_l2_folder_not_created_yet_measures_its_mount(tmp_path: Path) -> None:
    """Before the first deploy the L2 folder does not exist (lmcache-server's deploy creates it on the
    mount provisioning made): the checks measure its parent instead of failing `run`'s gate."""
    checks, _numa = probe.probe_l2(str(tmp_path / "lmcache-l2"), 1)
    mount = checks[0]
    assert mount["name"] == "l2_mount" and mount["status"] != "fail"
    assert "(not created yet: deploy creates it; measured its parent)" in mount["detail"]
    assert [c["name"] for c in checks] == ["l2_mount", "l2_trim", "l2_direct_io"]
    assert list(tmp_path.iterdir()) == []  # the throughput probe's file is gone
    [missing], numa = probe.probe_l2(str(tmp_path / "no-mount" / "lmcache-l2"), 1)
    assert (missing["status"], numa) == ("fail", None)
    assert (
        missing["fix"] == f"provision the nvme tier: nvme_storage mounts the NVMe on {tmp_path / 'no-mount'}"
    )
