#!/usr/bin/python3
"""Ansible module: the software versions of a lab host, read in one module run.

Of the kvoffload.lab collection, called by its collect role for cell.json `software`: the installed
versions of the listed Debian packages (`dpkg-query`), the listed Python distributions of each venv
(the venv's own python and importlib.metadata: no pip needed), and the GPU driver with the CUDA or ROCm
version its tool reports (`nvidia-smi --version`, `amd-smi version`), and the version of each listed binary
that is on the host (`<path> version`: Caddy from its wheel, which dpkg does not know; it is recorded
under `packages` in place of the Debian package of the same name, which the unit then does not run).
It replaces `package_facts`, a
stat and a command per venv, the GPU tool's command and a Jinja parse of their output: five round
trips to each host became one (about 4 s of a node's first collect on the 2-core lab machine). It
only reads: check mode reports the same record.

The record (`software`) is what the controller writes as `software/<host>.json`: host, groups,
packages (name -> version, those not installed left out), python (venv -> name -> version, venvs
missing on the host left out) and gpu (tool, driver, cuda, rocm; only what the tool reported). A host
without dpkg-query records no packages; one without the GPU tool on PATH records no driver. Standard
library only: it runs on the host's own python3.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_software
short_description: Read a host's Debian packages, venv distributions and GPU driver versions at once
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Returns the installed versions of I(debian_packages), of I(python_packages) in each of I(venvs), and
    the driver version that I(gpu_tool) reports, as one record for the controller's software folder.
  - Only reads; runs in check mode too.
options:
  host: {type: str, required: true, description: "The host's inventory name, recorded as is."}
  groups: {type: list, elements: str, default: [], description: "Its inventory groups, recorded sorted."}
  debian_packages: {type: list, elements: str, default: [], description: "Debian packages to look up."}
  venvs: {type: list, elements: path, default: [], description: "Virtual environments to look in."}
  python_packages: {type: list, elements: str, default: [], description: "Distributions to look up."}
  gpu_tool:
    {type: str, choices: ["", nvidia-smi, amd-smi], default: "", description: "GPU tool to ask; empty: none."}
  binaries:
    type: dict
    default: {}
    description: >-
      Name -> path of binaries asked `<path> version`; one on the host replaces the package of its name.
"""

EXAMPLES = r"""
- name: Read the versions the run depends on
  kvoffload.lab.kvoffload_software:
    host: "{{ inventory_hostname }}"
    groups: "{{ group_names }}"
    debian_packages: [python3, systemd, nvme-cli]
    venvs: [/opt/kvoffload/venv]
    python_packages: [vllm, lmcache, torch]
    gpu_tool: nvidia-smi
    binaries:
      caddy: /usr/local/bin/caddy
  register: software

- name: Keep the record on the controller
  ansible.builtin.copy:
    content: "{{ software.software | to_nice_json }}"
    dest: "results/software/{{ inventory_hostname }}.json"
    mode: "0644"
  delegate_to: localhost
"""

RETURN = r"""
software:
  description: "{host, groups, packages, python, gpu}: what the controller writes as software/<host>.json."
  type: dict
  returned: always
"""

_GPU_ARGV = {"nvidia-smi": ["nvidia-smi", "--version"], "amd-smi": ["amd-smi", "version"]}
# nvidia-smi --version: "DRIVER version : 580.159.04" and "CUDA Version : 13.0";
# amd-smi version: "... | ROCm version: 6.2.4".
_GPU_FIELDS = {
    "driver": re.compile(r"DRIVER version\s*:\s*(\S+)"),
    "cuda": re.compile(r"CUDA Version\s*:\s*(\S+)"),
    "rocm": re.compile(r"ROCm version:\s*([^\s|]+)"),
}
# `caddy version`: "v2.11.7 h1:yj0Y4f..." (a wheel's build) or "2.6.2" (Debian's).
_BINARY_VERSION = re.compile(r"\bv?([0-9]+(?:\.[0-9]+)+)")
# dpkg's second status letter of a package whose files are on the host (installed, or awaiting a trigger)
_INSTALLED = ("i", "W", "t")
# Run by each venv's python: the versions of the names it is given, as JSON.
_VERSIONS_SCRIPT = """
import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def parse_dpkg(text: str, wanted: list[str]) -> dict[str, str]:
    """`dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'` output -> installed versions
    of `wanted` (the first line of a package installed for several architectures)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0] not in wanted or parts[0] in found:
            continue
        status = parts[2]
        if len(status) >= 2 and status[1] in _INSTALLED and parts[1]:
            found[parts[0]] = parts[1]
    return found


def parse_gpu(tool: str, text: str) -> dict[str, str]:
    """The GPU tool's version text -> {tool, driver, cuda, rocm}, only what it reported."""
    record = {"tool": tool}
    for field, pattern in _GPU_FIELDS.items():
        match = pattern.search(text)
        if match:
            record[field] = match.group(1)
    return record


def parse_binary_version(text: str) -> str | None:
    """A binary's `version` output -> its version (X.Y.Z), None when it names none."""
    found = _BINARY_VERSION.search(text)
    return found.group(1) if found else None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "groups": {"type": "list", "elements": "str", "default": []},
            "debian_packages": {"type": "list", "elements": "str", "default": []},
            "venvs": {"type": "list", "elements": "path", "default": []},
            "python_packages": {"type": "list", "elements": "str", "default": []},
            "gpu_tool": {"type": "str", "choices": ["", "nvidia-smi", "amd-smi"], "default": ""},
            "binaries": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,  # it only reads
    )
    p = module.params
    packages: dict[str, str] = {}
    if p["debian_packages"] and shutil.which("dpkg-query"):
        # exit 1 when some package is unknown to dpkg; the others are still printed
        _rc, out, _err = module.run_command(
            ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", *p["debian_packages"]]
        )
        packages = parse_dpkg(out, p["debian_packages"])
    for name, path in sorted(p["binaries"].items()):
        if Path(path).exists():  # a link to a binary that is there
            rc, out, _err = module.run_command([path, "version"])
            version = parse_binary_version(out) if rc == 0 else None
            if version:
                packages[name] = version
    python: dict[str, dict[str, str]] = {}
    for venv in p["venvs"]:
        interpreter = str(Path(venv, "bin", "python"))
        if not Path(interpreter).exists():  # load balancer only, or not provisioned yet
            continue
        rc, out, err = module.run_command([interpreter, "-I", "-c", _VERSIONS_SCRIPT, *p["python_packages"]])
        if rc != 0:
            module.fail_json(msg=f"{interpreter} could not read its distributions: {err.strip()[-400:]}")
        python[venv] = json.loads(out)
    gpu: dict[str, str] = {}
    if p["gpu_tool"] and shutil.which(p["gpu_tool"]):
        rc, out, _err = module.run_command(_GPU_ARGV[p["gpu_tool"]])
        if rc == 0 and out.strip():
            gpu = parse_gpu(p["gpu_tool"], out)
    software = {
        "host": p["host"],
        "groups": sorted(p["groups"]),
        "packages": packages,
        "python": python,
        "gpu": gpu,
    }
    module.exit_json(changed=False, software=software)


if __name__ == "__main__":
    main()
