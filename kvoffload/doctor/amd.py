"""The doctor's checks of an AMD node, judged on the controller from what the node probe recorded.

The probe (kvoffload/doctor/probe.py, standalone on the node) finds AMD GPUs on the PCI bus and records
raw facts in its `amd` section: the modes of /dev/kfd and the DRM render nodes, /opt/rocm/.info/version,
the text of `amd-smi version`, `amd-smi static --asic --bus --driver` and `rocminfo`, and the answers of
its HIP children (hipInit, a pinned host allocation with copies, HIP IPC to a second process) in a
unit-like sandbox. This module parses that text and turns it into check records of the probe's own JSON
shape (name, status, detail, fix, facts), which kvoffload/doctor/checks.py reads with the probe's
checks. Pure: text and mappings in, records out; no IO. Of the doctor only the probe is imported, for
the verdict its CUDA children share with the HIP ones (`verdict_children`): the probe imports nothing of
ours, so it stays a standalone file, and checks.py imports this module.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Mapping
from typing import Any

from kvoffload.doctor.probe import FAIL, OK, SKIP, WARN, GpuChildChecks, verdict_children
from kvoffload.doctor.probe import check as record  # one check's record, in the probe's JSON shape

AMD_CHECKS = ("amd_devices", "rocm", "amd_smi", "rocm_agents", "hip_init", "hip_pinned_memory", "hip_ipc")
# The checks cheap enough for `run`'s gate (no HIP child): see checks.CHEAP_CHECKS.
AMD_CHEAP_CHECKS = ("amd_devices", "rocm", "amd_smi", "rocm_agents")
# gfx targets vLLM 0.32's ROCm platform code names (vllm/platforms/rocm.py: _ON_GFX9 gfx90a, gfx942,
# gfx950; RDNA3 gfx11xx, RDNA4 gfx12xx): others (a pre-release gfx941 MI300X, a gfx908 MI100) get no
# kernels of the ROCm wheels.
VLLM_GFX_TARGETS = ("gfx90a", "gfx942", "gfx950")
VLLM_GFX_FAMILIES = ("gfx11", "gfx12")
INSTALL_FIX = (
    "install amdgpu-dkms and ROCm (gpu_driver_install: true on Ubuntu 22.04/24.04), reboot, run provision"
)


# The probe's HIP children judged as its CUDA children are (probe.py CUDA_CHILD_CHECKS).
HIP_CHILD_CHECKS = GpuChildChecks(
    init="hip_init",
    pinned="hip_pinned_memory",
    ipc="hip_ipc",
    runtime="HIP",
    sandbox="NoNewPrivileges, DeviceAllow /dev/kfd and DRM",
    init_facts={"hip_driver_version": "driver_version", "hip_runtime_version": "runtime_version"},
    child_facts=("uid",),
    fix_in_sandbox=(
        "the units' device allow list or groups: DeviceAllow=/dev/kfd rw, DeviceAllow=char-drm rw "
        "and SupplementaryGroups=render video (roles/vllm, roles/lmcache_server)"
    ),
    fix_init="see amd_devices and rocm above; libamdhip64.so comes with rocm-hip-runtime",
    fix_ipc=(
        "two processes of one user could not share a GPU buffer through /dev/kfd, so no replica "
        "can hand its KV to lmcache-server: see `dmesg | grep -i kfd`"
    ),
)

# ---------------------------------------------------------------------------------------------------
# Parsers (text in, values out)


def parse_rocm_version(text: str | None) -> str | None:
    """/opt/rocm/.info/version ("6.4.1-120") as its release ("6.4.1")."""
    match = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", text or "")
    return match.group(1) if match else None


def parse_amd_smi_version(text: str) -> dict[str, str]:
    """`amd-smi version`: "AMDSMI Tool: 25.4.2+aca1101 | AMDSMI Library version: 25.4.0 | ROCm version:
    6.4.1 | amdgpu version: 6.12.12 | ..." as {tool, library, rocm, amdgpu} (those it prints)."""
    keys = {"AMDSMI Tool": "tool", "AMDSMI Library version": "library", "ROCm version": "rocm"}
    out: dict[str, str] = {}
    for part in text.strip().splitlines()[0].split(" | ") if text.strip() else []:
        key, sep, value = part.partition(":")
        if not sep:
            continue
        name = keys.get(key.strip()) or key.strip().lower().removesuffix(" version").replace(" ", "_")
        out[name] = value.strip()
    return out


def parse_amd_smi_blocks(text: str) -> dict[str, dict[str, Any]]:
    """`amd-smi static` / `amd-smi list` as {"0": {...}, ...}, one nested dict per "GPU: N" block
    (sections by 4-space indentation; "CPU: N" blocks and anything outside a GPU block are left out)."""
    gpus: dict[str, dict[str, Any]] = {}
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, _, value = raw.strip().partition(":")
        if indent == 0:
            stack = []
            if key == "GPU" and value.strip().isdigit():
                gpus[value.strip()] = {}
                stack = [(0, gpus[value.strip()])]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.strip()] = value.strip()
        else:
            section: dict[str, Any] = {}
            parent[key.strip()] = section
            stack.append((indent, section))
    return gpus


def amd_smi_gpus(text: str) -> list[dict[str, Any]]:
    """Per GPU of `amd-smi static`: index, market name, gfx target, PCI address, driver version."""

    def get(block: Mapping[str, Any], section: str, key: str) -> str | None:
        value = (block.get(section) or {}).get(key)
        return value if isinstance(value, str) and value != "N/A" else None

    return [
        {
            "gpu": index,
            "market_name": get(block, "ASIC", "MARKET_NAME"),
            "target": get(block, "ASIC", "TARGET_GRAPHICS_VERSION"),
            "bdf": get(block, "BUS", "BDF"),
            "driver": get(block, "DRIVER", "VERSION"),
        }
        for index, block in parse_amd_smi_blocks(text).items()
    ]


_AGENT = re.compile(r"^\*+\s*\nAgent (\d+)\s*\n\*+\s*$", re.MULTILINE)
_AGENT_KEYS = {
    "Name": "name",
    "Marketing Name": "marketing_name",
    "Device Type": "device_type",
    "BDFID": "bdfid",
    "Compute Unit": "compute_units",
    "Node": "node",
}


def parse_rocminfo(text: str) -> list[dict[str, str]]:
    """rocminfo's HSA agents (CPUs and GPUs): name (gfx target for a GPU), marketing name, device type,
    BDFID, compute units, node; from each agent's top-level lines (two-space indent)."""
    parts = _AGENT.split(text)
    agents = []
    for body in parts[2::2]:
        agent: dict[str, str] = {}
        for line in body.splitlines():
            if not line.startswith("  ") or line.startswith("   "):
                continue  # nested (cache, pools, ISA) or not an agent line
            key, sep, value = line.strip().partition(":")
            if sep and key in _AGENT_KEYS and _AGENT_KEYS[key] not in agent:
                # a doc-rendered output may end values with a stray backslash (rocminfo's docs do)
                agent[_AGENT_KEYS[key]] = value.strip().rstrip("\\").strip()
        agents.append(agent)
    return agents


def vllm_knows(target: str) -> bool:
    return target in VLLM_GFX_TARGETS or target.startswith(VLLM_GFX_FAMILIES)


# ---------------------------------------------------------------------------------------------------
# Verdicts (facts in, records out)


def verdict_devices(pci: list[str], kfd_mode: int | None, render: list[Mapping[str, Any]]) -> dict[str, Any]:
    """/dev/kfd and one DRM render node per AMD GPU must be character devices (`render`: the probe's
    /sys/class/drm/renderD* entries: node, mode, vendor, pci)."""
    amd_nodes = [r for r in render if r.get("vendor") == "0x1002"]
    usable = [r for r in amd_nodes if isinstance(r.get("mode"), int) and stat.S_ISCHR(r["mode"])]
    facts = {"pci": pci, "kfd": kfd_mode is not None, "render": [r.get("node") for r in usable]}
    if kfd_mode is None or not stat.S_ISCHR(kfd_mode):
        return record(
            "amd_devices",
            FAIL,
            f"/dev/kfd {'missing' if kfd_mode is None else 'is not a character device'} "
            f"({len(pci)} AMD GPU(s) on the PCI bus): ROCm cannot open a GPU",
            "load amdgpu with its compute interface (`modprobe amdgpu`; `dmesg | grep -i kfd`), or "
            + INSTALL_FIX,
            **facts,
        )
    if len(usable) < len(pci):
        return record(
            "amd_devices",
            FAIL,
            f"{len(usable)} AMD render node(s) in /dev/dri for {len(pci)} AMD GPU(s)",
            "a GPU amdgpu did not initialise: `dmesg | grep -i amdgpu` (firmware, a GPU off the bus)",
            **facts,
        )
    return record(
        "amd_devices", OK, f"/dev/kfd and {len(usable)} render node(s) for {len(pci)} GPU(s)", **facts
    )


def verdict_rocm(version_text: str | None, smi_version: Mapping[str, str]) -> dict[str, Any]:
    """ROCm's user space: /opt/rocm/.info/version (what vLLM's ROCm platform reads), and the amdgpu
    driver's version as amd-smi reports it."""
    version = parse_rocm_version(version_text)
    facts = {"rocm": version, "amdgpu": smi_version.get("amdgpu"), "smi_rocm": smi_version.get("rocm")}
    if version is None:
        return record(
            "rocm", FAIL, "no ROCm user space (/opt/rocm/.info/version missing)", INSTALL_FIX, **facts
        )
    driver = f", amdgpu {facts['amdgpu']}" if facts["amdgpu"] not in (None, "N/A") else ""
    return record("rocm", OK, f"ROCm {version}{driver}", **facts)


def verdict_amd_smi(
    version: Mapping[str, Any] | None, static: Mapping[str, Any] | None, pci: list[str]
) -> dict[str, Any]:
    """amd-smi answers `version` and lists every PCI GPU in `static` (`version`/`static`: the probe's
    {rc, out, err} of each command). GPU telemetry, collect and the doctor read it."""
    fix = (
        "install AMD's amd-smi-lib (gpu_driver_install: true installs it); the telemetry unit looks for "
        "amd-smi in /opt/rocm/bin"
    )
    if not version or version.get("rc") != 0:
        error = (version or {}).get("err") or (version or {}).get("out") or "not found"
        return record("amd_smi", FAIL, f"amd-smi version does not answer: {str(error).strip()[-300:]}", fix)
    parsed = parse_amd_smi_version(str(version.get("out", "")))
    gpus = amd_smi_gpus(str((static or {}).get("out", ""))) if (static or {}).get("rc") == 0 else []
    facts = {**parsed, "gpus": gpus}
    names = sorted({g["market_name"] or "?" for g in gpus})
    shown = f"amd-smi {parsed.get('tool', '?')} (library {parsed.get('library', '?')})"
    if len(gpus) < len(pci):
        return record(
            "amd_smi",
            WARN,
            f"{shown} lists {len(gpus)} GPU(s) in `amd-smi static`, the PCI bus has {len(pci)}: "
            "telemetry will miss GPUs",
            "see `amd-smi static --asic --bus`; a GPU the driver did not initialise "
            "(`dmesg | grep -i amdgpu`)",
            **facts,
        )
    return record("amd_smi", OK, f"{shown}: {len(gpus)} GPU(s), {', '.join(names)}", **facts)


def verdict_agents(rocminfo: Mapping[str, Any] | None, pci: list[str]) -> dict[str, Any]:
    """rocminfo sees a GPU agent per PCI GPU (a partitioned MI300 shows more) of a gfx target vLLM's
    ROCm build knows."""
    if not rocminfo or rocminfo.get("rc") != 0:
        error = str((rocminfo or {}).get("err") or (rocminfo or {}).get("out") or "not found").strip()
        return record(
            "rocm_agents",
            FAIL,
            f"rocminfo failed: {error[-300:]}",
            "a `/dev/kfd` permission error means the user lacks the render group (the units get it by "
            "SupplementaryGroups=); otherwise " + INSTALL_FIX,
        )
    gpus = [a for a in parse_rocminfo(str(rocminfo.get("out", ""))) if a.get("device_type") == "GPU"]
    targets = sorted({a.get("name", "?") for a in gpus})
    facts = {"agents": gpus, "targets": targets}
    if len(gpus) < max(len(pci), 1):
        return record(
            "rocm_agents",
            FAIL,
            f"rocminfo lists {len(gpus)} GPU agent(s) for {len(pci)} AMD GPU(s) on the PCI bus",
            "HSA does not see every GPU: `dmesg | grep -i kfd`, and check the GPU in `amd-smi list`",
            **facts,
        )
    unknown = [t for t in targets if not vllm_knows(t)]
    if unknown:
        return record(
            "rocm_agents",
            WARN,
            f"{len(gpus)} GPU agent(s), target(s) {', '.join(targets)}: vLLM 0.32's ROCm build knows "
            f"{', '.join(VLLM_GFX_TARGETS)} and gfx11/gfx12, not {', '.join(unknown)}",
            "a pre-release target (gfx940/gfx941 MI300) needs the production firmware and driver, which "
            "report gfx942; other GPUs are not a target of the ROCm wheels",
            **facts,
        )
    names = sorted({a.get("marketing_name", "?") for a in gpus})
    shown = f"{len(gpus)} GPU agent(s): {', '.join(names)} ({', '.join(targets)})"
    return record("rocm_agents", OK, shown, **facts)


def verdict_hip(hip: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """hip_init (in the sandbox when there was one), hip_pinned_memory and hip_ipc from the probe's HIP
    children (`hip`: {sandboxed, plain, why, skipped}), as the probe judges its CUDA children."""
    how = HIP_CHILD_CHECKS
    if not hip or hip.get("skipped"):
        why = str((hip or {}).get("skipped") or "not run")
        return [record(name, SKIP, why) for name in (how.init, how.pinned, how.ipc)]
    return verdict_children(how, hip.get("sandboxed"), hip.get("plain"), hip.get("why") or "none")


def amd_checks(amd: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The AMD checks of a probe's `amd` section; none where the probe found no AMD GPU (a node without
    one keeps its report as it was)."""
    if not amd or not amd.get("pci"):
        return []
    pci = [str(p) for p in amd.get("pci") or []]
    version = amd.get("amd_smi_version")
    parsed = (
        parse_amd_smi_version(str(version.get("out", "")))
        if isinstance(version, Mapping) and version.get("rc") == 0
        else {}
    )
    kfd = amd.get("kfd_mode")
    return [
        verdict_devices(pci, kfd if isinstance(kfd, int) else None, list(amd.get("render") or [])),
        verdict_rocm(amd.get("rocm_version_file"), parsed),
        verdict_amd_smi(version, amd.get("amd_smi_static"), pci),
        verdict_agents(amd.get("rocminfo"), pci),
        *verdict_hip(amd.get("hip")),
    ]
