"""The doctor on an AMD node: the probe's `amd` facts from a fake sysfs/dev tree and recorded tool
outputs (tests/fixtures/gpu/amd, AMD's own documented outputs: SOURCE.md there), and the verdicts of
kvoffload/doctor/amd.py on them, as the controller reads them (checks.probe_checks). The HIP children
cannot run here (no ROCm, no AMD GPU): their verdicts are judged on answers shaped as child_hip writes
them, and child_hip itself is run to show it fails cleanly without libamdhip64.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from kvoffload.doctor import amd
from kvoffload.doctor import probe as p
from kvoffload.doctor.checks import CHEAP_CHECKS, PAIR_BLOCKERS, Status, probe_checks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "amd"
CHR = stat.S_IFCHR | 0o660
DIR = stat.S_IFDIR | 0o755


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_amd_smi_version_old_and_new_formats() -> None:
    assert amd.parse_amd_smi_version(_fixture("amd-smi-version-rocm6.1.txt")) == {
        "tool": "23.4.2+505b858",
        "library": "24.2.0.0",
        "rocm": "6.1.0",
    }
    assert amd.parse_amd_smi_version(_fixture("amd-smi-version-rocm6.4.1-mi300x.txt")) == {
        "tool": "25.4.2+aca1101",
        "library": "25.4.0",
        "rocm": "6.4.1",
        "amdgpu": "6.12.12",
        "amd_hsmp": "N/A",
    }


def test_amd_smi_static_of_an_mi300a_node_and_an_mi308x() -> None:
    gpus = amd.amd_smi_gpus(_fixture("amd-smi-static-mi300a.txt"))  # CPU blocks first, then 4 GPUs
    assert [g["gpu"] for g in gpus] == ["0", "1", "2", "3"]
    assert {g["market_name"] for g in gpus} == {"MI300A"}
    assert [g["bdf"] for g in gpus] == ["0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"]
    assert gpus[0]["driver"] == "6.9.0-rc5+" and gpus[0]["target"] is None  # that amd-smi had no target yet
    (asic,) = amd.amd_smi_gpus(_fixture("amd-smi-static-asic-mi308x.txt"))
    assert (asic["market_name"], asic["target"], asic["bdf"]) == ("MI308X", "gfx942", None)


def test_rocminfo_agents_of_amds_mi300x_example() -> None:
    agents = amd.parse_rocminfo(_fixture("rocminfo-mi300x.txt"))
    assert [a["device_type"] for a in agents] == ["CPU", "GPU"]
    gpu = agents[1]
    assert (gpu["name"], gpu["marketing_name"], gpu["compute_units"], gpu["bdfid"]) == (
        "gfx941",
        "AMD Instinct MI300X",
        "304",
        "768",
    )
    # the doc's stray backslashes are not part of a value
    assert agents[0]["marketing_name"] == "AMD Ryzen 9 7950X 16-Core Processor"


def _tree(root: Path, gpus: int = 1, kfd: bool = True) -> None:
    """A node with `gpus` MI300X-class PCI functions, their render nodes and (maybe) /dev/kfd; the
    /dev nodes are regular files here, judged by the modes the probe records."""
    for i in range(gpus):
        dev = root / "sys/bus/pci/devices" / f"0000:{0x11 + i:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x1002\n")
        (dev / "class").write_text("0x120000\n")
        node = root / "sys/class/drm" / f"renderD{128 + i}"
        node.mkdir(parents=True)
        (node / "device").symlink_to(dev)
        (root / "dev/dri").mkdir(parents=True, exist_ok=True)
        (root / "dev/dri" / f"renderD{128 + i}").write_text("")
    if kfd:
        (root / "dev/kfd").write_text("")
    (root / "opt/rocm/.info").mkdir(parents=True)
    (root / "opt/rocm/.info/version").write_text("6.4.1-120\n")


def _recorded(cmd: list[str]) -> tuple[int, str, str]:
    """amd-smi and rocminfo as AMD documents them (tests/fixtures/gpu/amd)."""
    tool, rest = Path(cmd[0]).name, cmd[1:]
    if tool == "amd-smi" and rest == ["version"]:
        return 0, _fixture("amd-smi-version-rocm6.4.1-mi300x.txt"), ""
    if tool == "amd-smi" and rest[:1] == ["static"]:
        return 0, _fixture("amd-smi-static-asic-mi308x.txt"), ""
    if tool == "rocminfo":
        return 0, _fixture("rocminfo-mi300x.txt"), ""
    raise AssertionError(cmd)


def _probe(root: Path, monkeypatch: pytest.MonkeyPatch, no_cuda: bool = True) -> dict[str, Any] | None:
    bindir = root / "opt/rocm/bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for tool in ("amd-smi", "rocminfo"):
        (bindir / tool).write_text("")
    monkeypatch.setattr(p.shutil, "which", lambda name: None)  # found in /opt/rocm/bin only
    args = p.parse_args(["--no-cuda"] if no_cuda else [])
    return p.probe_amd(root, args, "", 1 << 20, 1 << 20, run=_recorded)


def _as_controller(facts: dict[str, Any] | None, modes: dict[str, int]) -> dict[str, Any] | None:
    """The probe's facts with the /dev modes a real node has (files stand in for devices here)."""
    if facts is None:
        return None
    if facts["kfd_mode"] is not None:
        facts["kfd_mode"] = modes.get("/dev/kfd", CHR)
    for node in facts["render"]:
        node["mode"] = modes.get(node["node"], CHR) if node["mode"] is not None else None
    return facts


def test_the_probe_records_an_mi300x_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path)
    facts = _probe(tmp_path, monkeypatch)
    assert facts is not None
    assert facts["pci"] == ["0000:11:00.0"]
    assert facts["render"][0]["node"] == "/dev/dri/renderD128"
    assert (facts["render"][0]["vendor"], facts["render"][0]["pci"]) == ("0x1002", "0000:11:00.0")
    assert facts["rocm_version_file"] == "6.4.1-120"
    assert facts["amd_smi_static"]["out"].startswith("GPU: 0\n    ASIC:")
    assert facts["hip"] == {"skipped": "--no-cuda"}
    checks = {c.name: c for c in probe_checks({"checks": [], "amd": _as_controller(facts, {})})}
    assert [n for n in checks] == list(amd.AMD_CHECKS)
    assert checks["amd_devices"].status == Status.OK
    assert checks["rocm"].status == Status.OK and checks["rocm"].detail == "ROCm 6.4.1, amdgpu 6.12.12"
    assert checks["amd_smi"].status == Status.OK and "MI308X" in checks["amd_smi"].detail
    # AMD's rocminfo example is of a pre-release MI300X (gfx941): no target of vLLM's ROCm wheels
    assert checks["rocm_agents"].status == Status.WARN and "gfx941" in checks["rocm_agents"].detail
    assert {checks[n].status for n in ("hip_init", "hip_pinned_memory", "hip_ipc")} == {Status.SKIP}


def test_no_kfd_fails_with_a_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, kfd=False)
    facts = _probe(tmp_path, monkeypatch)
    assert facts is not None and facts["kfd_mode"] is None
    (devices,) = [c for c in probe_checks({"amd": _as_controller(facts, {})}) if c.name == "amd_devices"]
    assert devices.status == Status.FAIL
    assert devices.detail.startswith("/dev/kfd missing (1 AMD GPU(s) on the PCI bus)")
    assert "modprobe amdgpu" in devices.fix and "gpu_driver_install: true" in devices.fix
    # the cheap gate of `run` and the pair's bring-up both stop on it
    assert "amd_devices" in CHEAP_CHECKS and "amd_devices" in PAIR_BLOCKERS


def test_a_gpu_without_a_render_node_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, gpus=2)
    (tmp_path / "dev/dri/renderD129").unlink()
    facts = _as_controller(_probe(tmp_path, monkeypatch), {})
    verdict = amd.amd_checks(facts)[0]
    assert verdict["status"] == "fail"
    assert verdict["detail"] == "1 AMD render node(s) in /dev/dri for 2 AMD GPU(s)"
    # and amd-smi's one GPU (the MI308X recording) is fewer than the PCI bus's two: telemetry misses one
    assert amd.amd_checks(facts)[2]["status"] == "warn"


def test_a_node_without_amd_gpus_gets_no_amd_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _probe(tmp_path, monkeypatch) is None
    assert amd.amd_checks(None) == []
    only = probe_checks({"checks": [p.check("python", "ok", "host Python 3.12.3")], "amd": None})
    assert [c.name for c in only] == ["python"]


def test_missing_tools_and_rocm_fail() -> None:
    missing = {"rc": 127, "out": "", "err": "not found on PATH or in /opt/rocm/bin"}
    facts = {
        "pci": ["0000:11:00.0"],
        "kfd_mode": CHR,
        "render": [{"node": "/dev/dri/renderD128", "mode": CHR, "vendor": "0x1002"}],
        "rocm_version_file": None,
        "amd_smi_version": missing,
        "amd_smi_static": missing,
        "rocminfo": {"rc": 1, "out": "", "err": "Unable to open /dev/kfd read-write: Permission denied"},
        "hip": {"skipped": "--no-cuda"},
    }
    by_name = {r["name"]: r for r in amd.amd_checks(facts)}
    assert by_name["rocm"]["status"] == "fail" and "/opt/rocm/.info/version" in by_name["rocm"]["detail"]
    assert by_name["amd_smi"]["status"] == "fail" and "amd-smi-lib" in by_name["amd_smi"]["fix"]
    assert by_name["rocm_agents"]["status"] == "fail" and "render group" in by_name["rocm_agents"]["fix"]


def _hip_answer(**parts: Any) -> dict[str, Any]:
    return {"uid": 998, "no_new_privs": 1, **parts}


INIT = {"ok": True, "devices": ["AMD Instinct MI300X"], "driver_version": 60443484, "runtime_version": 1}
PINNED = {"ok": True, "bytes": 1 << 30, "register_s": 0.21, "h2d_gb_s": 51.3, "d2h_gb_s": 48.9}


@pytest.mark.parametrize(
    ("hip", "expected"),
    [
        (
            {"sandboxed": _hip_answer(init=INIT, pinned=PINNED, ipc={"ok": True}), "plain": None, "why": ""},
            ["ok", "ok", "ok"],
        ),
        (  # fails in the sandbox only: the units' device list or groups
            {
                "sandboxed": _hip_answer(init={"ok": False, "error": "hipInit: hipErrorNoDevice (100)"}),
                "plain": _hip_answer(init=INIT),
                "why": "",
            },
            ["fail", "skip", "skip"],
        ),
        (
            {
                "sandboxed": None,
                "plain": _hip_answer(init=INIT, pinned=PINNED, ipc={"ok": False, "error": "x"}),
            },
            ["ok", "ok", "fail"],
        ),
    ],
)
def test_hip_verdicts(hip: dict[str, Any], expected: list[str]) -> None:
    records = amd.verdict_hip(hip)
    assert [r["status"] for r in records] == expected
    if hip.get("sandboxed") and not hip["sandboxed"]["init"]["ok"]:
        assert "it works outside the sandbox" in records[0]["detail"]
        assert "DeviceAllow=/dev/kfd rw" in records[0]["fix"]
    if expected[1] == "ok":
        assert "h2d 51.3 GB/s" in records[1]["detail"]


def test_the_hip_child_fails_cleanly_without_rocm() -> None:
    if (Path(p.ROCM_PATH) / "lib" / "libamdhip64.so").exists():
        pytest.skip("this machine has ROCm")
    answer = p.child_hip(1 << 20, 1 << 20)
    assert answer["init"]["ok"] is False and answer["init"]["error"].startswith("libamdhip64.so:")
    (init, *_) = amd.verdict_hip({"sandboxed": None, "plain": answer, "why": "not root"})
    assert init["status"] == "fail" and "rocm-hip-runtime" in init["fix"]


def test_the_hip_sandbox_is_the_rocm_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p.shutil, "which", lambda name: "/usr/bin/systemd-run")
    monkeypatch.setattr(p.Path, "is_dir", lambda self: True)
    monkeypatch.setattr(p.os, "geteuid", lambda: 0)
    prefix, why = p.sandbox_command("kvoffload-engine", p.ROCM_SANDBOX_PROPERTIES)
    props = [prefix[i + 1] for i, word in enumerate(prefix) if word == "-p"]
    assert why == "" and {"DeviceAllow=/dev/kfd rw", "DeviceAllow=char-drm rw"} <= set(props)
    assert "SupplementaryGroups=render video" in props and "NoNewPrivileges=yes" in props
    # the same lines the ROCm units carry (tests/unit/roles/test_rendered_units.py ROCM_DEVICES)
    from tests.unit.roles.test_rendered_units import ROCM_DEVICES

    assert [f"DeviceAllow={v}" for v in ROCM_DEVICES["DeviceAllow"]] + [
        f"SupplementaryGroups={v}" for v in ROCM_DEVICES["SupplementaryGroups"]
    ] == list(p.ROCM_SANDBOX_PROPERTIES)
