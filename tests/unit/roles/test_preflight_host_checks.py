"""The preflight role's host checks (roles/preflight/tasks/host_python.yml, gpu_devices.yml,
gpu_fabric.yml) against recorded facts: their assert expressions are templated the way Ansible does.

`nvidia-smi -q` is the real output of an H200 (a single GPU without NVSwitches, so its fabric state is
"N/A"; serial numbers redacted); the NVSwitch states are that output with the State line changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, role_defaults

TASKS = ROLES / "preflight" / "tasks"
H200_SMI_Q = (Path(__file__).parent / "fixtures" / "nvidia-smi-q-h200.txt").read_text()


def _assert(file: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        t for t in yaml.safe_load((TASKS / file).read_text()) if "ansible.builtin.assert" in t
    )
    return found


def _check(file: str, variables: dict[str, Any]) -> tuple[bool, str]:
    """Whether the file's assert holds, and its failure message."""
    task = _assert(file)
    merged = {**role_defaults("preflight"), "inventory_hostname": "gpu1", **variables}
    merged.update({k: trust_as_template(v) for k, v in task.get("vars", {}).items()})
    templar = Templar(loader=DataLoader(), variables=merged)
    that = task["ansible.builtin.assert"]["that"]
    that = that if isinstance(that, list) else [that]
    ok = all(templar.template(trust_as_template("{{ " + t + " }}")) is True for t in that)
    message = templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"]))
    return ok, str(message)


def _python(micro: str, **extra: Any) -> dict[str, Any]:
    major, minor, patch = (int(p) for p in micro.split("."))
    facts = {
        "python": {"version": {"major": major, "minor": minor, "micro": patch}},
        "distribution": "Ubuntu",
    }
    return {"ansible_facts": facts, **extra}


@pytest.mark.parametrize(
    ("host", "wheelhouse", "ok", "says"),
    [
        ("3.11.2", "3.11.2", True, ""),  # Debian 12
        ("3.12.3", None, True, ""),  # Ubuntu 24.04 installing from an index
        (
            "3.12.3",
            "3.11.2",
            False,
            "run again with --hosts-python 3.12.3",
        ),  # Ubuntu 24.04, default wheelhouse
        ("3.10.12", None, False, "vLLM 0.32 needs 3.11 or newer"),  # Ubuntu 22.04
    ],
)
def test_host_python_against_vllms_minimum_and_the_wheelhouse(
    host: str, wheelhouse: str | None, ok: bool, says: str
) -> None:
    variables = _python(
        host,
        kvoffload_wheelhouse="/cache/wheelhouse.tar" if wheelhouse else None,
        kvoffload_wheelhouse_python=wheelhouse,
    )
    holds, message = _check("host_python.yml", variables)
    assert holds is ok
    assert says in message


# An 8-GPU node's driver files as `grep -H '^Device Minor:'` prints them (the file's tab-aligned
# "Device Minor: \t 0" line); the driver numbers GPU 5 (PCI order) as minor 6 here and GPU 6 as 5, as
# it may when its probe order is not the PCI bus order.
PCI = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
       "0000:ba:00.0", "0000:db:00.0"]  # fmt: skip
MINORS = dict(enumerate([0, 1, 2, 3, 4, 6, 5, 7]))


def _grep(listed: list[int]) -> str:
    return "\n".join(
        f"/proc/driver/nvidia/gpus/{PCI[i]}/information:Device Minor: \t {MINORS[i]}" for i in listed
    )


def _stat_lines(chr_paths: list[str], other: dict[str, str] | None = None) -> list[str]:
    """`stat --dereference --format '%F|%n'`'s stdout: a line per file it found (missing ones only on
    stderr, "stat: cannot statx '/dev/nvidia7': No such file or directory")."""
    return [f"character special file|{p}" for p in chr_paths] + [f"{t}|{p}" for p, t in (other or {}).items()]


def _devices(gpus: list[str], listed: list[int], stat: list[str]) -> dict[str, Any]:
    return {
        "ansible_local": {"kvoffload_gpu": {"count": 8, "devices": [{"pci": p} for p in PCI]}},
        "vllm_replicas": [{"index": i, "gpus": g} for i, g in enumerate(gpus)],
        "_preflight_nvidia_minors": {"rc": 0, "stdout": _grep(listed)},
        "_preflight_nvidia_devices": {"rc": 0, "stdout_lines": stat},
    }


BASE = ["/dev/nvidiactl", "/dev/nvidia-uvm"]


@pytest.mark.parametrize(
    ("stat", "missing"),
    [
        # every node there, as on the H200 above (crw-rw-rw- 195,255 /dev/nvidiactl, 238,0 /dev/nvidia-uvm)
        (_stat_lines([*BASE, "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia6"]), None),
        (_stat_lines(["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia6"]), "/dev/nvidia-uvm"),
        (
            _stat_lines(
                ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia6"],
                {"/dev/nvidia-uvm": "regular empty file"},
            ),
            "/dev/nvidia-uvm",
        ),
        (
            [],
            "/dev/nvidiactl and /dev/nvidia-uvm and /dev/nvidia0 (GPU 0, 0000:18:00.0) and /dev/nvidia1 "
            "(GPU 1, 0000:2a:00.0) and /dev/nvidia6 (GPU 5, 0000:ab:00.0)",
        ),
        # the control and UVM nodes alone are not enough: GPU 5's own node (minor 6) is missing
        (
            _stat_lines([*BASE, "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia5"]),
            "/dev/nvidia6 (GPU 5, 0000:ab:00.0)",
        ),
    ],
)
def test_device_files_of_the_driver_uvm_and_each_replica_gpu_must_be_character_devices(
    stat: list[str], missing: str | None
) -> None:
    # replica 0 on GPU 0, replica 1 tensor-parallel over GPUs 1 and 5
    ok, message = _check("gpu_devices.yml", _devices(["0", "1,5"], [0, 1, 5], stat))
    assert ok is (missing is None)
    if missing:
        assert message.startswith(f"{missing} on gpu1: not a character device, or not listed by the driver.")
        assert "as root, `nvidia-modprobe -c=255 -c=<minor>` creates them" in message


def test_the_device_files_read_are_those_of_the_replicas_gpus_by_the_drivers_minor() -> None:
    variables = {**role_defaults("preflight"), **_devices(["0", "1,5"], [0, 1, 5], [])}
    templar = Templar(loader=DataLoader(), variables=variables)
    tasks = yaml.safe_load((TASKS / "gpu_devices.yml").read_text())
    grep, stat = (
        templar.template(trust_as_template(t["ansible.builtin.command"]["argv"])) for t in tasks[:2]
    )
    assert grep == ["grep", "-H", "^Device Minor:"] + [
        f"/proc/driver/nvidia/gpus/{PCI[i]}/information" for i in (0, 1, 5)
    ]
    assert stat == [
        "stat",
        "--dereference",
        "--format",
        "%F|%n",
        *BASE,
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia6",
    ]
    # a GPU the driver does not list: named by its id and PCI address, never guessed as /dev/nvidia5
    ok, message = _check(
        "gpu_devices.yml",
        _devices(["0", "1,5"], [0, 1], _stat_lines([*BASE, "/dev/nvidia0", "/dev/nvidia1"])),
    )
    assert ok is False
    assert message.startswith("GPU 5 (0000:ab:00.0, no /proc/driver/nvidia/gpus entry) on gpu1: ")
    # before the first read (nothing registered yet) every GPU's file is asked for
    fresh = {k: v for k, v in variables.items() if k != "_preflight_nvidia_minors"}
    argv = Templar(loader=DataLoader(), variables=fresh).template(
        trust_as_template(tasks[0]["ansible.builtin.command"]["argv"])
    )
    assert len(argv) == 3 + 3


def _fabric(state: str) -> str:
    assert "        State                                          : N/A\n" in H200_SMI_Q
    return H200_SMI_Q.replace(
        "    Fabric\n        State                                          : N/A",
        f"    Fabric\n        State                                          : {state}",
    )


@pytest.mark.parametrize(
    ("service", "smi", "ok"),
    [
        ("active", _fabric("Completed"), True),
        ("active", H200_SMI_Q, True),  # a GPU that reports no fabric state (N/A)
        ("active", _fabric("In Progress"), False),  # Fabric Manager still training: CUDA error 802
        ("inactive", _fabric("Completed"), False),
        ("failed", _fabric("Not Started"), False),  # e.g. Fabric Manager of another version than the driver
    ],
)
def test_fabric_manager_and_the_fabric_state_with_nvswitches(service: str, smi: str, ok: bool) -> None:
    variables = {
        "ansible_local": {"kvoffload_gpu": {"nvswitch_count": 4}},
        "_preflight_fabricmanager": {"stdout": service + "\n"},
        "_preflight_smi_q": {"rc": 0, "stdout": smi},
    }
    holds, message = _check("gpu_fabric.yml", variables)
    assert holds is ok
    state = "N/A" if smi == H200_SMI_Q else smi.split("    Fabric\n")[1].splitlines()[0].split(": ")[1]
    assert f"nvidia-fabricmanager is {service} and the GPUs' fabric states are {state} " in message


def test_fabric_checks_run_without_gpu_driver_install() -> None:
    """The checks hang on the NVSwitch count alone, and the engine roles include them on the CUDA path."""
    for task in yaml.safe_load((TASKS / "gpu_fabric.yml").read_text()):
        assert task["when"] == "ansible_local.kvoffload_gpu.nvswitch_count | default(0) | int > 0", task[
            "name"
        ]
    for role in ("vllm", "lmcache_server"):
        tasks = yaml.safe_load((ROLES / role / "tasks" / "preflight.yml").read_text())
        include = next(t for t in tasks if t["name"] == "Check the NVIDIA device files and fabric")
        assert include["ansible.builtin.include_role"]["name"] == "preflight"
        assert include["loop"] == ["gpu_devices.yml", "gpu_fabric.yml"]
        assert not any("gpu_driver_install" in str(w) for w in include["when"])
