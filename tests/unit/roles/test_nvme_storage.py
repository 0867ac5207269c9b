"""nvme_storage beyond its loop-device tests: holders and swap detection on fake kernel views, the L2
fstab options, and the periodic-job timers a cell masks (deploy) and gives back (teardown).

The module's checks read /sys/class/block and /proc/swaps through module constants, pointed here at
trees in tmp_path (this machine's kernel may have no device-mapper; tests/integration/test_nvme_safety.py
runs the real ones where it can). The timer tasks need a systemd PID 1: the virtual-lab tests run them
with every cell's deploy and teardown; here their task files and plays are read and templated.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import REPO, ROLES, collection_module, role_defaults

TASKS = ROLES / "nvme_storage" / "tasks"


def blockdev() -> ModuleType:
    return collection_module("kvoffload_blockdev")


def test_holders_name_the_stacked_devices_and_their_dm_names(tmp_path: Path) -> None:
    mod = blockdev()
    mod.SYS_CLASS_BLOCK = str(tmp_path)
    (tmp_path / "nvme1n1" / "holders").mkdir(parents=True)
    (tmp_path / "nvme1n1p1" / "holders" / "dm-3").mkdir(parents=True)
    (tmp_path / "nvme1n1p1" / "holders" / "md0").mkdir(parents=True)
    (tmp_path / "dm-3" / "dm").mkdir(parents=True)
    (tmp_path / "dm-3" / "dm" / "name").write_text("vg0-l2\n")
    assert mod._holders("nvme1n1") == []
    assert mod._holders("nvme1n1p1") == ["dm-3 (vg0-l2)", "md0"]
    assert mod._holders("absent") == []  # no sysfs view (containers): nothing to tell


def test_swaps_are_matched_by_device_number(tmp_path: Path) -> None:
    mod = blockdev()
    # A swap file (not a block device) and a vanished entry are skipped; /dev/null stands in for a
    # device node only in that it is one (a character device is not a block device either).
    swapfile = tmp_path / "swap file"
    swapfile.write_bytes(b"\0" * 4096)
    swaps = tmp_path / "swaps"
    swaps.write_text(
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        f"{str(swapfile).replace(' ', chr(92) + '040')}\tfile\t\t4\t\t0\t\t-2\n"
        "/dev/does-not-exist\tpartition\t4\t0\t-3\n"
    )
    mod.PROC_SWAPS = str(swaps)
    assert mod._swaps() == []
    block = next((path for path in sorted(Path("/dev").iterdir()) if _is_block(path)), None)
    if block is None:
        pytest.skip("no block device node under /dev to stand in for a swap partition")
    swaps.write_text(swaps.read_text() + f"{block}\tpartition\t4\t0\t-4\n")
    st = block.stat()
    assert mod._swaps() == [((os.major(st.st_rdev), os.minor(st.st_rdev)), str(block))]


def _is_block(path: Path) -> bool:
    try:
        return stat.S_ISBLK(path.stat().st_mode)
    except OSError:
        return False


def _template(expression: str, variables: dict[str, Any]) -> Any:
    """The value Ansible gives the expression (native types: a list stays a list)."""
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def _task(path: Path, name: str) -> dict[str, Any]:
    tasks = yaml.safe_load(path.read_text())
    found: dict[str, Any] = next(t for t in _flatten(tasks) if t["name"] == name)
    return found


def _flatten(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for task in tasks:
        out.append(task)
        out += _flatten(task.get("block", []))
    return out


@pytest.mark.parametrize(
    ("persist", "expected"), [(True, "noatime,nofail,x-systemd.device-timeout=30s"), (False, "noatime")]
)
def test_fstab_entry_is_nofail_with_a_device_timeout(persist: bool, expected: str) -> None:
    mount = _task(TASKS / "configure.yml", "Mount the L2 file systems")["ansible.posix.mount"]
    variables = {**role_defaults("nvme_storage"), "nvme_storage_persist": persist}
    assert _template(mount["opts"], variables).strip() == expected
    variables["nvme_storage_device_timeout"] = 7
    assert ("x-systemd.device-timeout=7s" in _template(mount["opts"], variables)) is persist


def test_the_timers_of_periodic_disk_jobs_are_masked_for_the_cell() -> None:
    timers = role_defaults("nvme_storage")["nvme_storage_quiet_timers"]
    for timer in (
        "fstrim.timer",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "man-db.timer",
        "e2scrub_all.timer",
    ):
        assert timer in timers
    tasks = yaml.safe_load((TASKS / "quiet.yml").read_text())
    names = [t["name"] for t in tasks]
    # What is done is recorded first, then the timers stop, then they are masked (what `systemctl mask
    # --runtime` writes) and the masks loaded; jobs already started are waited for last.
    record = names.index("Record what this deploy masks and which of those timers ran")
    stop = names.index("Stop the timers")
    mask = names.index("Runtime-mask the timers")
    reload = names.index("Make systemd see the masks")
    wait = names.index("Wait until none of the jobs the timers start runs any more")
    assert record < stop < mask < reload < wait
    link = tasks[mask]["ansible.builtin.file"]
    assert link == {
        "src": "/dev/null",
        "dest": "/run/systemd/system/{{ item }}",
        "state": "link",
        "force": False,
    }
    assert tasks[reload]["ansible.builtin.systemd_service"] == {"daemon_reload": True}
    assert tasks[reload]["when"] == "_nvme_storage_masks is changed"  # idempotent: no reload the second time
    assert tasks[stop]["ansible.builtin.systemd_service"]["state"] == "stopped"
    assert tasks[record]["when"] == "not _nvme_storage_quiet_record.stat.exists"  # an earlier record wins
    # Read-only commands never report a change and still run in --check, so --check sees the real state.
    for task in tasks:
        if "ansible.builtin.command" in task:
            assert task["changed_when"] is False and task["check_mode"] is False, task["name"]


def test_only_timers_installed_and_not_masked_by_an_admin_are_candidates() -> None:
    read = _task(TASKS / "quiet.yml", "Read which listed timers run now and the job each starts")
    listing = (
        "apt-daily.timer enabled enabled\n"
        "fstrim.timer masked enabled\n"  # an administrator's mask stays theirs
        "man-db.timer masked-runtime enabled\n"
        "e2scrub_all.timer enabled enabled\n"
        "systemd-tmpfiles-clean.timer static -\n"
    )
    variables = {
        **role_defaults("nvme_storage"),
        "_nvme_storage_timer_files": {"stdout_lines": listing.splitlines()},
    }
    candidates = _template(read["vars"]["_nvme_storage_quiet_candidates"], variables)
    assert sorted(candidates) == ["apt-daily.timer", "e2scrub_all.timer"]


def test_teardown_removes_only_the_recorded_masks_and_restarts_what_ran() -> None:
    tasks = _flatten(yaml.safe_load((TASKS / "unquiet.yml").read_text()))
    by_name = {t["name"]: t for t in tasks}
    remove = by_name["Remove the runtime masks"]
    assert remove["ansible.builtin.file"]["state"] == "absent"
    assert "selectattr('stat.lnk_source', 'eq', '/dev/null')" in remove["loop"]
    start = by_name["Start the timers that ran before the cell"]
    assert start["loop"] == "{{ _nvme_storage_unquiet.active }}"
    assert start["ansible.builtin.systemd_service"]["state"] == "started"
    names = [t["name"] for t in tasks]
    assert names.index("Forget the record") == len(names) - 1


@pytest.mark.parametrize(
    ("playbook", "tasks_from"), [("deploy.yml", "quiet.yml"), ("teardown.yml", "unquiet.yml")]
)
def test_deploy_and_teardown_apply_it_on_the_node_and_the_client(playbook: str, tasks_from: str) -> None:
    plays = yaml.safe_load((REPO / "playbooks" / playbook).read_text())
    found = [
        p
        for p in plays
        for t in p.get("tasks", [])
        if {k: v for k, v in (t.get("ansible.builtin.include_role") or {}).items() if k != "apply"}
        == {"name": "nvme_storage", "tasks_from": tasks_from}
    ]
    assert len(found) == 1 and found[0]["hosts"] == "vllm:lmcache:client" and found[0]["become"] is True
    # Tagged, so that the orchestrator masks once per node and campaign and unmasks after its last cell.
    tag = tasks_from.removesuffix(".yml")
    (task,) = [t for t in found[0]["tasks"] if "ansible.builtin.include_role" in t]
    assert task["tags"] == [tag] and task["ansible.builtin.include_role"]["apply"] == {"tags": [tag]}
    # Masked before anything of the cell starts, given back after everything of it stopped.
    assert plays.index(found[0]) == (0 if playbook == "deploy.yml" else len(plays) - 1)


def test_the_record_keeps_what_ran_and_the_jobs_to_wait_for() -> None:
    decide = _task(TASKS / "quiet.yml", "Set the timers this cell masks (an earlier deploy's record wins)")
    shown = {
        "apt-daily.timer": "Unit=apt-daily.service\nActiveState=active",
        "fstrim.timer": "Unit=fstrim.service\nActiveState=inactive",
    }
    variables = {
        "_nvme_storage_quiet_record": {"stat": {"exists": False}},
        "_nvme_storage_timer_state": {"results": [{"item": k, "stdout": v} for k, v in shown.items()]},
    }
    assert _template(decide["ansible.builtin.set_fact"]["_nvme_storage_quiet"], variables) == {
        "masked": ["apt-daily.timer", "fstrim.timer"],
        "active": ["apt-daily.timer"],
        "jobs": ["apt-daily.service", "fstrim.service"],
    }
