"""gpu_driver's AMD path without a host: the refusal of hosts AMD publishes no repository for, the amdgpu
and ROCm repositories (repo.radeon.com's layout, a mirror, per Ubuntu codename), the key's pin, the
reboot's condition, the services' checks on a recorded `amd-smi list`, and the detection fact on an
MI300X-class PCI device (class 0x1200).

No molecule scenario covers it: the role's container is Debian 12, where the path only refuses. Real
hosts (Ubuntu with AMD GPUs) were not at hand; README "What is not exercised here".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, render, role_defaults, trusted
from tests.unit.roles.test_gpu_driver import _device, _run_fact

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "amd"


def _defaults() -> dict[str, Any]:
    return {k: trusted(v) for k, v in role_defaults("gpu_driver").items()}


def _template(expression: str, variables: dict[str, Any]) -> Any:
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def _tasks(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load((ROLES / "gpu_driver" / "tasks" / name).read_text())
    return found


def _task(file: str, name: str) -> dict[str, Any]:
    return next(t for t in _tasks(file) if t["name"] == name)


def _facts(distribution: str, release: str, architecture: str = "x86_64") -> dict[str, Any]:
    return {
        "distribution": distribution,
        "distribution_release": release,
        "architecture": architecture,
        "kernel": "6.8.0-51-generic",
    }


def _holds(conditions: list[str], variables: dict[str, Any]) -> bool:
    return all(_template("{{ " + c + " }}", variables) is True for c in conditions)


def test_the_amd_path_replaces_the_refusal() -> None:
    main = _tasks("main.yml")
    assert not [t for t in main if "Refuse to install an AMD" in t["name"]]
    amd = next(t for t in main if t.get("ansible.builtin.import_tasks") == "amd.yml")
    assert amd["when"] == ["gpu_driver_install", "kvoffload_gpu_vendor == 'amd'"]
    services = next(t for t in main if t.get("ansible.builtin.import_tasks") == "amd_services.yml")
    assert services["when"] == "kvoffload_gpu_vendor == 'amd'"  # also where the admin installed ROCm
    # the driver install comes before the handlers' reboot, the services' checks after it
    names = [t["name"] for t in main]
    reboot = names.index("Reboot into the new driver now, not at the end of the play")
    assert names.index(amd["name"]) < reboot < names.index(services["name"])


@pytest.mark.parametrize(
    ("facts", "allowed"),
    [
        (_facts("Ubuntu", "jammy"), True),
        (_facts("Ubuntu", "noble"), True),
        (_facts("Debian", "bookworm"), False),  # AMD publishes no Debian repository for ROCm
        (_facts("Ubuntu", "focal"), False),
        (_facts("Ubuntu", "noble", "aarch64"), False),  # ROCm's apt repositories are amd64 only
    ],
)
def test_only_ubuntu_jammy_and_noble_on_x86_64_get_the_driver(facts: dict[str, Any], allowed: bool) -> None:
    task = _task("amd.yml", "Refuse a distribution AMD publishes no repository for")
    variables = {**_defaults(), "ansible_facts": facts, "inventory_hostname": "gpu7"}
    assert _holds(task["ansible.builtin.assert"]["that"], variables) is allowed
    message = _template(task["ansible.builtin.assert"]["fail_msg"], variables)
    assert "gpu7" in message and f"{facts['distribution']} {facts['distribution_release']}" in message
    assert "none for Debian" in message and "gpu_driver_install: false" in message


def _sources(**overrides: Any) -> str:
    variables = {**_defaults(), "ansible_facts": _facts("Ubuntu", "noble"), **overrides}
    return render("gpu_driver", "etc/apt/sources.list.d/kvoffload-rocm.sources.j2", variables)


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith("#"))
        stanzas.append(fields)
    return stanzas


def test_the_repositories_follow_repo_radeon_coms_layout_per_codename() -> None:
    amdgpu, rocm = _stanzas(_sources())
    assert amdgpu["URIs"] == "https://repo.radeon.com/amdgpu/6.4.1/ubuntu"
    assert rocm["URIs"] == "https://repo.radeon.com/rocm/apt/6.4.1"
    for stanza in (amdgpu, rocm):
        assert (stanza["Suites"], stanza["Components"], stanza["Architectures"]) == ("noble", "main", "amd64")
        assert stanza["Signed-By"] == "/etc/apt/keyrings/kvoffload-rocm.asc"
    jammy = _stanzas(_sources(ansible_facts=_facts("Ubuntu", "jammy")))
    assert {s["Suites"] for s in jammy} == {"jammy"}


def test_a_mirror_and_other_releases_change_every_uri() -> None:
    mirrored = _stanzas(
        _sources(gpu_driver_amd_repo_base="https://mirror.lab/radeon", gpu_driver_amd_rocm_version="6.4.3")
    )
    assert [s["URIs"] for s in mirrored] == [
        "https://mirror.lab/radeon/amdgpu/6.4.3/ubuntu",  # the driver follows the ROCm release by default
        "https://mirror.lab/radeon/rocm/apt/6.4.3",
    ]
    variables = {**_defaults(), "gpu_driver_amd_repo_base": "https://mirror.lab/radeon"}
    assert (
        _template("{{ gpu_driver_amd_key_url }}", variables) == "https://mirror.lab/radeon/rocm/rocm.gpg.key"
    )
    # a driver of its own release line (ROCm 7.1 on), given as a whole URL with a trailing slash
    own = _stanzas(_sources(gpu_driver_amd_amdgpu_repo_url="https://repo.radeon.com/amdgpu/30.10/ubuntu/"))
    assert own[0]["URIs"] == "https://repo.radeon.com/amdgpu/30.10/ubuntu"


def test_an_existing_entry_is_looked_for_by_the_same_uris() -> None:
    look = _task("amd.yml", "Look for an entry for AMD's repositories")
    argv = look["ansible.builtin.command"]["argv"]
    variables = _defaults()
    patterns = [_template(argv[i + 1], variables) for i, word in enumerate(argv) if word == "-e"]
    assert patterns == [
        "https://repo.radeon.com/amdgpu/6.4.1/ubuntu",
        "https://repo.radeon.com/rocm/apt/6.4.1",
    ]
    assert "--exclude=kvoffload-rocm.sources" in argv  # our own file is not someone else's entry
    add = _task("amd.yml", "Add the amdgpu and ROCm repositories for {{ gpu_driver_amd_codename }}")
    assert add["when"] == "_gpu_driver_amd_entries.stdout_lines | length == 0"


@pytest.mark.parametrize(("checksum", "pinned"), [("", False), ("sha256:" + "ab" * 32, True)])
def test_the_key_is_pinned_when_a_checksum_is_given(checksum: str, pinned: bool) -> None:
    get_url = _task("amd.yml", "Place AMD's repository signing key")["ansible.builtin.get_url"]
    variables = {**_defaults(), "gpu_driver_amd_key_checksum": checksum, "omit": "__omit__"}
    value = _template(get_url["checksum"], variables)
    assert (value != "__omit__") is pinned
    if pinned:
        assert value == checksum
    assert _template(get_url["dest"], variables) == "/etc/apt/keyrings/kvoffload-rocm.asc"


def test_the_pin_prefers_amds_origin() -> None:
    pin = render("gpu_driver", "etc/apt/preferences.d/kvoffload-rocm.pref.j2", _defaults())
    assert "Package: *\nPin: release o=repo.radeon.com\nPin-Priority: 600\n" in pin


def test_packages_are_the_dkms_driver_and_the_runtime_the_lab_uses() -> None:
    variables = {**_defaults(), "ansible_facts": _facts("Ubuntu", "noble")}
    assert _template("{{ gpu_driver_amd_packages }}", variables) == [
        "amdgpu-dkms",
        "rocm-hip-runtime",
        "rocminfo",
        "amd-smi-lib",
    ]
    assert _template("{{ gpu_driver_amd_build_packages }}", variables) == [
        "linux-headers-6.8.0-51-generic",
        "linux-modules-extra-6.8.0-51-generic",
    ]
    install = _task("amd.yml", "Install amdgpu-dkms and the ROCm user space")
    assert install["notify"] == "Reboot into the new driver"
    hold = next(
        t for t in _tasks("amd.yml") if t["name"].startswith("Hold amdgpu-dkms and the ROCm packages")
    )
    packages = {"amdgpu-dkms": [{}], "rocminfo": [{}]}  # a --check of a partly installed host
    assert _template(hold["loop"], {**variables, "ansible_facts": {"packages": packages}}) == [
        "amdgpu-dkms",
        "rocminfo",
    ]


@pytest.mark.parametrize(
    ("installed", "loaded", "reboot"),
    [
        ("6.12.12\n", None, True),  # the kernel's own amdgpu is loaded (it has no version)
        ("6.12.12\n", "6.12.12", False),
        ("6.12.12\n", "6.10.5", True),  # an older DKMS module still loaded
        ("\n", None, False),  # only the kernel's own module on disk: nothing to reboot into
    ],
)
def test_a_reboot_is_asked_for_when_the_dkms_module_is_not_the_loaded_one(
    installed: str, loaded: str | None, reboot: bool
) -> None:
    note = _task("amd.yml", "Note that the loaded amdgpu module is not the installed one")
    assert note["notify"] == "Reboot into the new driver"
    variables = {
        "_gpu_driver_amd_modinfo": {"rc": 0, "stdout": installed},
        "ansible_local": {"kvoffload_gpu": {"module_version": loaded}},
    }
    assert _holds(note["when"], variables) is reboot


def _amd_smi_list() -> dict[str, Any]:
    text = (FIXTURES / "amd-smi-list.txt").read_text()
    return {"rc": 0, "stdout": text, "stdout_lines": text.splitlines()}


@pytest.mark.parametrize(
    ("drivers", "ok"),
    [(["amdgpu", "amdgpu"], True), (["amdgpu", "amdgpu", "amdgpu"], False), (["amdgpu", None], False)],
)
def test_amd_smi_must_list_every_pci_gpu_bound_to_amdgpu(drivers: list[str | None], ok: bool) -> None:
    check = _task("amd_services.yml", "Check that amd-smi sees every GPU on the PCI bus")
    devices = [{"pci": f"0000:{i:02x}:00.0", "driver": d} for i, d in enumerate(drivers)]
    variables = {
        **_defaults(),
        "kvoffload_gpu_vendor": "amd",
        "_gpu_driver_amd_smi": _amd_smi_list(),  # AMD's recorded two-GPU listing
        "ansible_local": {"kvoffload_gpu": {"count": len(devices), "devices": devices}},
    }
    assert _holds(check["ansible.builtin.assert"]["that"], variables) is ok


@pytest.mark.parametrize(
    ("pending", "drivers", "ready"),
    [(False, ["amdgpu"], True), (True, ["amdgpu"], False), (False, [None], False)],
)
def test_the_services_checks_wait_for_a_bound_driver(
    pending: bool, drivers: list[str | None], ready: bool
) -> None:
    note = _task("amd_services.yml", "Note whether the amdgpu driver is loaded")
    expression = note["ansible.builtin.set_fact"]
    variables = {
        "_gpu_driver_pending": pending,
        "ansible_local": {"kvoffload_gpu": {"devices": [{"driver": d} for d in drivers]}},
    }
    assert _template(expression["_gpu_driver_ready"], variables) is ready
    gated = {t["name"] for t in _tasks("amd_services.yml") if t.get("when") == "_gpu_driver_ready"}
    assert {"Check that ROCm's compute device exists", "Check that amd-smi answers"} <= gated


def test_the_fact_counts_mi300_class_accelerators_for_amd_only(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _device(root, "0000:05:00.0", "0x1002", "0x120000", driver="amdgpu")  # MI300X: processing accelerator
    _device(root, "0000:c1:00.0", "0x1002", "0x038000", driver="amdgpu")  # MI210: display controller
    _device(root, "0000:17:00.0", "0x10de", "0x120000")  # an NVIDIA function of that class is no GPU here
    amd = _run_fact(tmp_path, root, "amd")
    assert [d["pci"] for d in amd["devices"]] == ["0000:05:00.0", "0000:c1:00.0"]
    assert _run_fact(tmp_path, root, "nvidia")["count"] == 0
