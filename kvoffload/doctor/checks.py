"""The doctor's records and the checks only the controller can make (pure: JSON in, records out).

A node's checks are the probe's (kvoffload/doctor/probe.py, run on the node) plus these: the host's
Python against the wheelhouse's, the engine set's pinned versions against the engine venv's, whether
the host answered at all, and the vLLM/LMCache smoke check's standing. No IO, no printing, no ansible.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvoffload.doctor.amd import AMD_CHEAP_CHECKS, amd_checks
from kvoffload.doctor.smoke import judge
from kvoffload.doctor.verdict import Check as Check
from kvoffload.doctor.verdict import Status as Status
from kvoffload.doctor.verdict import worst as worst

# Where the engine venv comes from: deploy.yml's `install` tag, which `run` applies before a node's first
# cell and the smoke check before its round trip (provision.yml does not install it).
ENGINE_SET_FIX = (
    "`kvoffload-lab run` (or `doctor`'s smoke check) installs the engine set before a node's first cell"
)


# The probe's checks cheap enough for `run` to make before its first cell (no CUDA child, no engine
# import, a small L2 probe): see kvoffload/orchestrate/checks/doctor.py CHEAP_ARGS.
CHEAP_CHECKS = frozenset(
    {"device_files", "driver", "fabric", "python", "memory", "l2_mount", "l2_direct_io", "wheelhouse_python"}
    | set(AMD_CHEAP_CHECKS)
)


# The failures that stop the smoke check's bring-up before it starts (provision's and the engine roles'
# preflight refuse such a host), so the doctor does not try it there. Others do not: an L2 mount not
# made yet is what provisioning makes, and a failing GPU check is better shown by the pair itself.
PAIR_BLOCKERS = frozenset({"reach", "python", "wheelhouse_python", "device_files", "fabric", "amd_devices"})


@dataclass(frozen=True)
class NodeReport:
    """One host's checks, and what its probe said of it (None when it never answered)."""

    host: str
    checks: tuple[Check, ...]
    probe: Mapping[str, Any] | None = None

    @property
    def status(self) -> Status:
        return worst(c.status for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == Status.FAIL)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": str(self.status),
            "checks": [c.to_json() for c in self.checks],
            "probe": dict(self.probe) if self.probe is not None else None,
        }


def probe_checks(probe: Mapping[str, Any]) -> list[Check]:
    """The probe's checks, and on a node with AMD GPUs those of its `amd` facts (doctor/amd.py)."""
    found = [c for c in probe.get("checks") or [] if isinstance(c, Mapping)]
    amd = probe.get("amd")
    return [Check.from_json(c) for c in (*found, *amd_checks(amd if isinstance(amd, Mapping) else None))]


def _facts(checks: Iterable[Check], name: str) -> Mapping[str, Any]:
    return next((c.facts for c in checks if c.name == name), {})


def wheelhouse_python(
    host_python: str | None, hosts_python: str | None, lab_pythons: Mapping[str, str] | None = None
) -> Check:
    """The wheelhouse holds wheels of one Python (X.Y): lmcache, torch and vLLM ship per-Python wheels,
    so a host whose python3 is another X.Y cannot install from it. `lab_pythons` (host -> X.Y.Z, when the
    wheelhouse's Python is learned from the hosts, as `run` does without --hosts-python): hosts that
    differ fail, since a lab has one wheelhouse."""
    name = "wheelhouse_python"
    if lab_pythons and len(set(lab_pythons.values())) > 1:
        listing = ", ".join(f"{h} {v}" for h, v in sorted(lab_pythons.items()))
        return Check(
            name,
            Status.FAIL,
            f"the lab's hosts run different Pythons ({listing}); the wheelhouse is one per lab, built for "
            "the Python they all report",
            "bring every host of the lab to the same release (docs/reference.md, Supported hosts)",
        )
    if hosts_python is None:
        return Check(name, Status.SKIP, "no wheelhouse (--no-wheelhouse): hosts install from their index")
    if not host_python:
        return Check(name, Status.SKIP, "the probe reported no Python version")
    want, have = hosts_python.split(".")[:2], host_python.split(".")[:2]
    if want != have:
        return Check(
            name,
            Status.FAIL,
            f"the wheelhouse is built for Python {'.'.join(want)} (--hosts-python {hosts_python}), "
            f"this host runs {host_python}",
            f"give `--hosts-python {host_python}` (the wheelhouse is then built for it)",
        )
    return Check(name, Status.OK, f"host Python {host_python} matches the wheelhouse's ({hosts_python})")


_PIN = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)")


def pinned(requirements: Sequence[str]) -> dict[str, str]:
    """name -> version of each `name==version` requirement (names lowercased, _ read as -)."""
    out = {}
    for req in requirements:
        match = _PIN.match(req)
        if match:
            out[match.group(1).lower().replace("_", "-")] = match.group(2)
    return out


def engine_set(installed: Mapping[str, Any], expected: Mapping[str, str]) -> Check:
    """The engine venv's vllm, lmcache and torch against the engine set's pins (`installed`: the
    probe's `engine` facts, `expected`: `pinned()` of the engine set)."""
    name = "engine_set"
    versions = installed.get("versions") if isinstance(installed.get("versions"), Mapping) else None
    if not expected:
        return Check(name, Status.SKIP, "no engine set on this host (not a vLLM host, or the simulator)")
    if versions is None:
        return Check(name, Status.SKIP, "no engine venv yet (provision installs it)")
    # a local version label is the build's (torch 2.13.0+cu130 is the set's torch==2.13.0)
    wrong = {
        pkg: (want, versions.get(pkg))
        for pkg, want in expected.items()
        if pkg in versions and str(versions.get(pkg)).split("+")[0] != want
    }
    if wrong:
        shown = ", ".join(f"{p} {have or 'missing'} (set pins {want})" for p, (want, have) in wrong.items())
        return Check(name, Status.FAIL, shown, ENGINE_SET_FIX)
    shown = ", ".join(f"{p} {versions[p]}" for p in expected if p in versions)
    return Check(name, Status.OK, f"as the engine set pins: {shown}")


def smoke_pair(
    probe: Mapping[str, Any] | None,
    engine: str,
    lmcache_here: bool,
    smoke: Mapping[str, Any] | None = None,
    why_not: str | None = None,
) -> Check:
    """The vLLM/LMCache pair as LMCache recommends checking it (kvoffload/doctor/smoke.py): with the
    round trip's facts (`smoke`) their verdict; without them, the probe's connector-module resolution
    and `why_not`, the reason the round trip did not run (--no-smoke, a failed check above)."""
    name = "smoke_pair"
    if engine != "vllm" or not lmcache_here:
        return Check(name, Status.SKIP, "no vLLM/LMCache pair on this host")
    if smoke is not None:
        return judge(smoke)
    engine_facts = _facts(probe_checks(probe or {}), "engine")
    versions = engine_facts.get("versions")
    if engine_facts and isinstance(versions, Mapping) and versions.get("lmcache"):
        if not engine_facts.get("connector"):
            return Check(
                name,
                Status.FAIL,
                "LMCache's connector module does not resolve in the engine venv",
                ENGINE_SET_FIX,
            )
        resolved = "connector module resolves; "
    else:
        resolved = ""
    return Check(
        name,
        Status.SKIP,
        f"{resolved}server start, registration and store/retrieve round trip not run: "
        f"{why_not or '--no-smoke'}",
    )


def unreachable(host: str, message: str) -> NodeReport:
    """A host the doctor could not probe: one failed check saying why."""
    return NodeReport(
        host,
        (
            Check(
                "reach",
                Status.FAIL,
                message,
                "check the inventory's address and ssh access (`ansible -m ping`)",
            ),
        ),
    )
