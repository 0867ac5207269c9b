"""The cell-free pair check's two transient units have the [Service] keys of the units they stand for.

`doctor`'s pair check (playbooks/doctor_pair.yml, kvoffload/doctor/pair_node.py) runs `lmcache server`
as kvoffload-lmcache.service runs and `lmcache bench server` as a replica, kvoffload-vllm@.service, runs:
the play builds the keys from the same variables the templates render (kvoffload_engine_sandbox, the
lmcache_server role's _lmcache_server_unit_resources, kvoffload_engine_user) and the node script turns
them into `systemd-run -p KEY=VALUE`. Here the real play (its vars and the included role task) and the
real node script build the command lines, and their keys must equal the rendered units' [Service]
keys, every one but those of the process itself (what it runs, its environment, its restarts, and the
L2 folder, which is the check's own). A key added to a template and not to the shared variable, or
dropped by the play or the script, fails here.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from kvoffload.doctor import pair_node
from tests.unit.roles.render import REPO, trusted
from tests.unit.roles.test_rendered_units import rendered_files, variables

# [Service] keys of what the unit runs, not of its sandbox: the transient units set their own
PROCESS_KEYS = frozenset(
    {
        "Type",
        "EnvironmentFile",
        "Environment",
        "ExecStart",
        "ExecStartPre",
        "Restart",
        "RestartSec",
        "TimeoutStopSec",
        "KillMode",
        "ReadWritePaths",
    }
)
PLAY = REPO / "playbooks" / "doctor_pair.yml"
ROLE_TASK = REPO / "roles" / "lmcache_server" / "tasks" / "unit_properties.yml"


def service_keys(unit: str) -> dict[str, list[str]]:
    """Key -> its values in the unit's [Service] section."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in unit.splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def play_units(variables: dict[str, Any]) -> dict[str, dict[str, pair_node.Value]]:
    """The play's `_doctor_pair_units` as Ansible computes it on a host: the included role task's
    set_fact first, then the play's vars."""
    v = dict(variables)
    [task] = yaml.safe_load(ROLE_TASK.read_text())
    for name, expr in task["ansible.builtin.set_fact"].items():
        v[name] = Templar(loader=DataLoader(), variables=v).template(trust_as_template(expr))
    [play] = yaml.safe_load(PLAY.read_text())
    v.update({k: trusted(x) for k, x in play["vars"].items()})
    units = Templar(loader=DataLoader(), variables=v).template(trust_as_template("{{ _doctor_pair_units }}"))
    assert isinstance(units, dict)
    return {
        role: {str(k): [str(i) for i in x] if isinstance(x, list) else str(x) for k, x in keys.items()}
        for role, keys in units.items()
    }


def command_keys(cmd: list[str]) -> dict[str, list[str]]:
    """The `-p KEY=VALUE` keys of a systemd-run command line, before its `--`."""
    head = cmd[: cmd.index("--")]
    out: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(head):
        if flag == "-p":
            key, val = value.split("=", 1)
            out.setdefault(key, []).append(val)
    return out


def transient(role: str, units: dict[str, dict[str, pair_node.Value]], l2_dir: str | None = None) -> list[str]:
    """The node script's systemd-run command of one of the two units."""
    props = pair_node.unit_properties(units[role], role, l2_dir)
    argv = ["/opt/kvoffload/venv/bin/lmcache", role]
    return pair_node.unit_command(
        f"kvoffload-doctor-pair-{role}-x", props, pair_node.unit_env(role), argv, wait=False
    )


@pytest.mark.parametrize(
    ("numa", "memlock", "tier"),
    [
        ([0], "infinity", "cpu"),
        ([0, 1], "infinity", "nvme"),
        ([0, 1, 2, 3], None, "cpu"),
        (None, "8G", "nvme"),
    ],
)
def test_the_transient_units_have_the_rendered_units_keys(
    numa: list[int] | None, memlock: str | None, tier: str
) -> None:
    local = {} if numa is None else {"kvoffload_gpu": {"numa_nodes": numa}}
    overrides: dict[str, Any] = {"ansible_local": local, "lmcache_server_limit_memlock": memlock}
    files = rendered_files(tier, "vllm", **overrides)
    units = play_units({**variables(tier, "vllm"), **overrides})
    for role, name in (("server", "kvoffload-lmcache.service"), ("bench", "kvoffload-vllm@.service")):
        rendered = {k: v for k, v in service_keys(files[name]).items() if k not in PROCESS_KEYS}
        keys = command_keys(transient(role, units, "/mnt/kvoffload-nvme/.kvoffload-doctor-pair-x"))
        assert {k: v for k, v in keys.items() if k != "ReadWritePaths"} == rendered, role
    server = command_keys(transient("server", units))
    # the server's own keys came through: NUMA interleave over 2+ nodes, LimitMEMLOCK when set
    assert server.get("NUMAMask") == ([",".join(map(str, numa))] if numa and len(numa) > 1 else None)
    assert server.get("LimitMEMLOCK") == ([memlock] if memlock else None)
    assert server["User"] == server["Group"] == ["kvoffload-engine"]
    assert server["StateDirectory"] == ["kvoffload-lmcache"]
    # the check's L2 folder is the server's one writable path besides its state folder
    with_l2 = command_keys(transient("server", units, "/mnt/kvoffload-nvme/.kvoffload-doctor-pair-x"))
    assert with_l2["ReadWritePaths"] == ["/mnt/kvoffload-nvme/.kvoffload-doctor-pair-x"]
    assert "ReadWritePaths" not in command_keys(transient("bench", units))


@pytest.mark.parametrize("tier", ["cpu", "nvme"])
def test_on_amd_both_transient_units_get_rocms_devices_as_the_rendered_units_do(tier: str) -> None:
    """ROCm's allow list (DeviceAllow= twice) and groups reach both transient units, so that the pair
    check on an AMD node runs with the devices the engines get, and no more."""
    files = rendered_files(tier, "vllm", vendor="amd")
    units = play_units(variables(tier, "vllm", vendor="amd"))
    for role, name in (("server", "kvoffload-lmcache.service"), ("bench", "kvoffload-vllm@.service")):
        rendered = {k: v for k, v in service_keys(files[name]).items() if k not in PROCESS_KEYS}
        keys = command_keys(transient(role, units, "/mnt/kvoffload-nvme/.kvoffload-doctor-pair-x"))
        assert {k: v for k, v in keys.items() if k != "ReadWritePaths"} == rendered, role
        assert keys["DeviceAllow"] == ["/dev/kfd rw", "char-drm rw"], role
        assert keys["SupplementaryGroups"] == ["render video"], role
    # and nowhere else: NVIDIA and the CPU build keep the device cgroup open (no allow list)
    for vendor, build in (("nvidia", "auto"), ("amd", "cpu")):
        v = {**variables(tier, "vllm", vendor=vendor), "kvoffload_engine_build": build}
        plain = play_units(v)
        assert not any("DeviceAllow" in command_keys(transient(r, plain)) for r in ("server", "bench"))


def test_a_key_written_into_one_template_only_is_caught() -> None:
    """The equality above is not vacuous: a hardening key a template states outside the shared map is a
    key the transient unit lacks."""
    files = rendered_files("cpu", "vllm")
    units = play_units(variables("cpu", "vllm"))
    edited = files["kvoffload-vllm@.service"].replace("[Install]", "ProtectClock=yes\n\n[Install]")
    rendered = {k: v for k, v in service_keys(edited).items() if k not in PROCESS_KEYS}
    assert command_keys(transient("bench", units)) != rendered
    assert set(rendered) - set(command_keys(transient("bench", units))) == {"ProtectClock"}


def test_the_shared_sandbox_is_rendered_in_both_units_from_one_map() -> None:
    shared = yaml.safe_load((REPO / "roles" / "kvoffload" / "defaults" / "main.yml").read_text())
    sandbox = shared["kvoffload_engine_sandbox"]
    assert all(isinstance(v, str) for v in sandbox.values())  # "yes", not YAML's True
    for path in (
        "roles/vllm/templates/etc/systemd/system/kvoffload-vllm@.service.j2",
        "roles/lmcache_server/templates/etc/systemd/system/kvoffload-lmcache.service.j2",
    ):
        text = Path(REPO, path).read_text()
        assert "kvoffload_engine_sandbox.items()" in text
        # no key of the shared map is also written out in the template
        assert not [k for k in sandbox if f"\n{k}=" in text], path
