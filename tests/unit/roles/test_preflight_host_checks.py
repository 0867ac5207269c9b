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


def _stat(path: str, ischr: bool | None) -> dict[str, Any]:
    stat: dict[str, Any] = {"exists": False} if ischr is None else {"exists": True, "ischr": ischr}
    return {"item": path, "stat": stat}


@pytest.mark.parametrize(
    ("ctl", "uvm", "missing"),
    [
        (True, True, None),  # the H200 above: crw-rw-rw- 195,255 /dev/nvidiactl and 238,0 /dev/nvidia-uvm
        (True, None, "/dev/nvidia-uvm"),  # nvidia_uvm not loaded, or loaded without its node
        (True, False, "/dev/nvidia-uvm"),  # a plain file where the node should be
        (None, None, "/dev/nvidiactl and /dev/nvidia-uvm"),
    ],
)
def test_device_files_must_be_character_devices(
    ctl: bool | None, uvm: bool | None, missing: str | None
) -> None:
    results = [_stat("/dev/nvidiactl", ctl), _stat("/dev/nvidia-uvm", uvm)]
    ok, message = _check("gpu_devices.yml", {"_preflight_nvidia_devices": {"results": results}})
    assert ok is (missing is None)
    if missing:
        assert message.startswith(f"{missing} on gpu1 is not a character device")


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
