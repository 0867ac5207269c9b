"""gpu_driver without a host: the CUDA repository derived per distribution and architecture (Ubuntu and
arm64 cannot be converged here, only Debian's mirror is reachable), the package set, and the detection
fact run against fake sysfs trees (NVIDIA GPUs and NVSwitches, AMD GPUs, Secure Boot's EFI variable).

The molecule scenario (roles/gpu_driver/molecule/default) runs the same fact and the install path in
--check on a Debian 12 container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, render, role_defaults, trusted

CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"
SECURE_BOOT = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def _defaults() -> dict[str, Any]:
    return {k: trusted(v) for k, v in role_defaults("gpu_driver").items()}


def _template(expression: str, variables: dict[str, Any]) -> Any:
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def _facts(distribution: str, major: str, version: str, architecture: str) -> dict[str, Any]:
    return {
        "distribution": distribution,
        "distribution_major_version": major,
        "distribution_version": version,
        "architecture": architecture,
        "kernel": "6.8.0-51-generic",
    }


@pytest.mark.parametrize(
    ("facts", "folder"),
    [
        (_facts("Debian", "12", "12.8", "x86_64"), "debian12/x86_64"),
        (_facts("Debian", "12", "12.8", "aarch64"), "debian12/sbsa"),
        (_facts("Ubuntu", "22", "22.04", "x86_64"), "ubuntu2204/x86_64"),
        (_facts("Ubuntu", "22", "22.04", "aarch64"), "ubuntu2204/sbsa"),
        (_facts("Ubuntu", "24", "24.04", "x86_64"), "ubuntu2404/x86_64"),
        (_facts("Ubuntu", "24", "24.04", "aarch64"), "ubuntu2404/sbsa"),
    ],
)
def test_cuda_repository_and_keyring_follow_distribution_and_architecture(
    facts: dict[str, Any], folder: str
) -> None:
    variables = {**_defaults(), "ansible_facts": facts}
    assert _template("{{ gpu_driver_nvidia_repo_url }}", variables) == f"{CUDA}/{folder}/"
    assert (
        _template("{{ gpu_driver_nvidia_keyring_deb }}", variables)
        == f"{CUDA}/{folder}/cuda-keyring_1.1-1_all.deb"
    )
    # Headers of the running kernel (Debian's and Ubuntu's package name alike) and dkms, before the driver.
    assert _template("{{ gpu_driver_nvidia_build_packages }}", variables) == [
        "linux-headers-6.8.0-51-generic",
        "dkms",
    ]


@pytest.mark.parametrize(("nvswitches", "fabricmanager"), [(0, False), (6, True)])
def test_packages_are_the_pinned_open_modules_and_fabric_manager_only_with_nvswitches(
    nvswitches: int, fabricmanager: bool
) -> None:
    variables = {
        **_defaults(),
        "ansible_facts": _facts("Debian", "12", "12.8", "x86_64"),
        "ansible_local": {"kvoffload_gpu": {"nvswitch_count": nvswitches}},
    }
    packages = _template("{{ _gpu_driver_nvidia_install }}", variables)
    assert packages[0] == "nvidia-open-580"
    assert ("nvidia-fabricmanager-580" in packages) is fabricmanager
    variables["gpu_driver_nvidia_branch"] = 590
    assert _template("{{ _gpu_driver_nvidia_install }}", variables)[0] == "nvidia-open-590"
    pin = render("gpu_driver", "etc/apt/preferences.d/kvoffload-nvidia-driver.pref.j2", variables)
    assert "Pin: version 590.*\nPin-Priority: 1000\n" in pin


def _device(root: Path, address: str, vendor: str, klass: str, driver: str | None = None) -> None:
    device = root / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(f"{vendor}\n")
    (device / "class").write_text(f"{klass}\n")
    if driver:
        (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (device / "driver").symlink_to(root / "bus" / "pci" / "drivers" / driver)


def _run_fact(tmp_path: Path, root: Path, vendor: str) -> dict[str, Any]:
    script = tmp_path / "kvoffload_gpu.fact"
    script.write_text(
        render("gpu_driver", "etc/ansible/facts.d/kvoffload_gpu.fact.j2", role_defaults("gpu_driver"))
    )
    env = dict(os.environ, KVOFFLOAD_GPU_SYSFS_ROOT=str(root), KVOFFLOAD_GPU_VENDOR=vendor)
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True, timeout=10
    )
    fact: dict[str, Any] = json.loads(out.stdout)
    return fact


def test_fact_counts_gpus_and_nvswitches_with_their_drivers(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _device(root, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch
    _device(root, "0000:18:00.0", "0x10de", "0x030200", driver="nvidia")
    _device(root, "0000:17:00.0", "0x10de", "0x030200")  # no driver bound
    _device(root, "0000:00:1f.0", "0x8086", "0x068000")  # Intel bridge of the same class: not an NVSwitch
    _device(root, "0000:c1:00.0", "0x1002", "0x038000", driver="amdgpu")
    (root / "module" / "nvidia").mkdir(parents=True)
    (root / "module" / "nvidia" / "version").write_text("580.95.05\n")

    nvidia = _run_fact(tmp_path, root, "nvidia")
    assert nvidia["count"] == 2
    assert nvidia["devices"] == [
        {"pci": "0000:17:00.0", "driver": None, "numa_node": None},
        {"pci": "0000:18:00.0", "driver": "nvidia", "numa_node": None},
    ]
    assert (nvidia["nvswitch_count"], nvidia["nvswitches"]) == (1, ["0000:05:00.0"])
    assert nvidia["module_version"] == "580.95.05"
    assert nvidia["secure_boot"] is None  # no efivarfs: legacy boot or not exposed

    amd = _run_fact(tmp_path, root, "amd")
    assert (amd["vendor"], amd["count"], amd["nvswitch_count"]) == ("amd", 1, 0)
    assert amd["devices"] == [{"pci": "0000:c1:00.0", "driver": "amdgpu", "numa_node": None}]
    assert amd["module_version"] is None


@pytest.mark.parametrize(
    ("data", "expected"), [(bytes([6, 0, 0, 0, 1]), True), (bytes([6, 0, 0, 0, 0]), False)]
)
def test_fact_reads_secure_boot_from_its_efi_variable(tmp_path: Path, data: bytes, expected: bool) -> None:
    root = tmp_path / "sys"
    efivars = root / "firmware" / "efi" / "efivars"
    efivars.mkdir(parents=True)
    (efivars / SECURE_BOOT).write_bytes(data)
    assert _run_fact(tmp_path, root, "nvidia")["secure_boot"] is expected


def test_fact_records_the_numa_layout_and_each_gpus_node(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _device(root, "0000:18:00.0", "0x10de", "0x030200", driver="nvidia")
    _device(root, "0000:9a:00.0", "0x10de", "0x030200", driver="nvidia")
    _device(root, "0000:ab:00.0", "0x10de", "0x030200", driver="nvidia")
    for address, node in (("0000:18:00.0", "0"), ("0000:9a:00.0", "1"), ("0000:ab:00.0", "-1")):
        (root / "bus" / "pci" / "devices" / address / "numa_node").write_text(f"{node}\n")
    (root / "devices" / "system" / "node").mkdir(parents=True)
    (root / "devices" / "system" / "node" / "online").write_text("0-1,3\n")
    fact = _run_fact(tmp_path, root, "nvidia")
    assert fact["numa_nodes"] == [0, 1, 3]
    assert [d["numa_node"] for d in fact["devices"]] == [0, 1, None]  # -1: the firmware does not say
    (root / "devices" / "system" / "node" / "online").unlink()
    assert _run_fact(tmp_path, root, "nvidia")["numa_nodes"] == []


def _tasks(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((ROLES / "gpu_driver" / "tasks" / name).read_text())
    return found


def _set_fact(file: str, task: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in _tasks(file) if t["name"] == task)["ansible.builtin.set_fact"]
    return found


@pytest.mark.parametrize(
    ("before", "nvswitches", "expected"),
    [
        (
            {"rc": 0, "stdout": "580.95.05\n"},
            6,
            ["nvidia-open-580", "nvidia-persistenced", "nvidia-fabricmanager-580=580.95.05-*"],
        ),
        # a first install: driver and Fabric Manager in one transaction, both the branch's newest
        ({"rc": 1, "stdout": ""}, 6, ["nvidia-open-580", "nvidia-persistenced", "nvidia-fabricmanager-580"]),
        ({"rc": 0, "stdout": "580.95.05\n"}, 0, ["nvidia-open-580", "nvidia-persistenced"]),
    ],
)
def test_fabric_manager_is_installed_at_the_drivers_exact_version(
    before: dict[str, Any], nvswitches: int, expected: list[str]
) -> None:
    variables = {
        **_defaults(),
        "ansible_facts": _facts("Debian", "12", "12.8", "x86_64"),
        "ansible_local": {"kvoffload_gpu": {"nvswitch_count": nvswitches}},
        "_gpu_driver_modinfo_before": before,
    }
    assert _template("{{ _gpu_driver_nvidia_install_specs }}", variables) == expected
    # apt's name list comes from the specs; holds and package checks from the bare names
    install = next(t for t in _tasks("nvidia.yml") if t["name"] == "Install the NVIDIA driver packages")
    assert install["ansible.builtin.apt"]["name"] == "{{ _gpu_driver_nvidia_install_specs }}"


@pytest.mark.parametrize(
    ("installed", "mismatch"), [("580.95.05-1", []), ("580.105.08-1", ["nvidia-fabricmanager-580"])]
)
def test_a_fabric_manager_of_another_version_than_the_module_fails(
    installed: str, mismatch: list[str]
) -> None:
    variables = {
        **_defaults(),
        "_gpu_driver_modinfo": {"rc": 0, "stdout": "580.95.05\n"},
        "ansible_facts": {
            "packages": {
                "nvidia-fabricmanager-580": [{"name": "nvidia-fabricmanager-580", "version": installed}]
            }
        },
    }
    assert _template("{{ _gpu_driver_fabricmanager_mismatch }}", variables) == mismatch


def test_uvm_and_persistence_do_not_wait_for_gpu_driver_install() -> None:
    main = _tasks("main.yml")
    services = next(t for t in main if t.get("ansible.builtin.import_tasks") == "nvidia_services.yml")
    assert services["when"] == "kvoffload_gpu_vendor == 'nvidia'"
    # a host whose admin installed the driver (gpu_driver_install false, no package facts gathered)
    variables: dict[str, Any] = {
        **_defaults(),
        "ansible_local": {"kvoffload_gpu": {"module_version": "580.95.05"}},
    }
    pending = _set_fact(
        "nvidia_services.yml",
        "Note whether the driver packages are still to be installed (--check of a first install)",
    )
    variables["_gpu_driver_pending"] = _template(pending["_gpu_driver_pending"], variables)
    ready = _set_fact("nvidia_services.yml", "Note whether the NVIDIA driver is loaded")["_gpu_driver_ready"]
    assert _template(ready, variables) is True
    variables["ansible_local"] = {"kvoffload_gpu": {"module_version": None}}  # no driver yet: nothing to do
    assert _template(ready, variables) is False
    gated = {
        t["name"] for t in _tasks("nvidia_services.yml") if "_gpu_driver_ready" in str(t.get("when", ""))
    }
    assert {"Load nvidia_uvm now", "Create /dev/nvidia-uvm", "Persistence mode"} <= gated
    create = next(t for t in _tasks("nvidia_services.yml") if t["name"] == "Create /dev/nvidia-uvm")
    assert create["ansible.builtin.command"]["argv"] == ["nvidia-modprobe", "-u", "-c=0"]


@pytest.mark.parametrize(("smi", "turn_on"), [("Enabled\nEnabled\n", False), ("Enabled\nDisabled\n", True)])
def test_persistence_mode_is_set_with_nvidia_smi_where_a_gpu_lacks_it(smi: str, turn_on: bool) -> None:
    task = next(
        t for t in _tasks("nvidia_persistence.yml") if t["name"].startswith("Turn persistence mode on")
    )
    assert task["ansible.builtin.command"]["argv"] == ["nvidia-smi", "-pm", "1"]
    result = {"stdout": smi, "stdout_lines": smi.splitlines()}
    assert _template("{{ " + task["when"] + " }}", {"_gpu_driver_persistence": result}) is turn_on


@pytest.mark.parametrize(
    ("facts", "persistenced"),
    [(_facts("Debian", "12", "12.8", "x86_64"), True), (_facts("Ubuntu", "24", "24.04", "x86_64"), False)],
)
def test_nvidia_persistenced_is_asked_for_by_that_name_only_on_debian(
    facts: dict[str, Any], persistenced: bool
) -> None:
    variables = {
        **_defaults(),
        "ansible_facts": facts,
        "ansible_local": {"kvoffload_gpu": {"nvswitch_count": 0}},
    }
    for expression in ("{{ _gpu_driver_nvidia_install }}", "{{ _gpu_driver_nvidia_install_specs }}"):
        packages = _template(expression, variables)
        assert packages[0] == "nvidia-open-580"
        assert ("nvidia-persistenced" in packages) is persistenced
    # Debian's own driver (source distro) lists the daemon once
    variables["gpu_driver_nvidia_source"] = "distro"
    assert _template("{{ _gpu_driver_nvidia_install }}", variables).count("nvidia-persistenced") == 1
