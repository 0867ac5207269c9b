"""nvme_storage beyond its loop-device tests: holders and swap detection on fake kernel views, the L2
fstab options, and the periodic-job timers a cell masks (deploy) and gives back (teardown).

The module's checks read /sys/class/block and /proc/swaps through module constants, pointed here at
trees in tmp_path (this machine's kernel may have no device-mapper; tests/integration/test_nvme_safety.py
runs the real ones where it can). The timers go through the collection's module kvoffload_quiet_timers,
run here against a systemctl stand-in with state (the virtual-lab tests run it under a real systemd with
every node's first deploy and last teardown); the plays that call it are read.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import REPO, ROLES, collection_module, role_defaults, run_collection_module
from tests.unit.roles.systemctl_standin import calls, stateful_systemctl

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


def _timer(active: str, unit: str, file_state: str = "enabled") -> dict[str, str]:
    return {"LoadState": "loaded", "ActiveState": active, "UnitFileState": file_state, "Unit": unit}


def _quiet(tmp_path: Path, bindir: Path, **args: object) -> dict[str, Any]:
    paths = {"record": str(tmp_path / "run" / "quiet-timers.json"), "runtime_dir": str(tmp_path / "runtime")}
    return run_collection_module("kvoffload_quiet_timers", tmp_path, bindir, {**paths, **args})


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
    (task,) = yaml.safe_load((TASKS / "quiet.yml").read_text())
    assert task["kvoffload.lab.kvoffload_quiet_timers"] == {
        "state": "quiet",
        "timers": "{{ nvme_storage_quiet_timers }}",
        "record": "/run/kvoffload/quiet-timers.json",
        "wait": "{{ nvme_storage_quiet_wait }}",
    }
    (undo,) = yaml.safe_load((TASKS / "unquiet.yml").read_text())
    assert undo["kvoffload.lab.kvoffload_quiet_timers"] == {
        "state": "unquiet",
        "record": "/run/kvoffload/quiet-timers.json",
    }


def test_only_timers_installed_and_not_masked_by_an_admin_are_candidates() -> None:
    listing = (
        "apt-daily.timer enabled enabled\n"
        "fstrim.timer masked enabled\n"  # an administrator's mask stays theirs
        "man-db.timer masked-runtime enabled\n"
        "e2scrub_all.timer enabled enabled\n"
        "systemd-tmpfiles-clean.timer static -\n"
    )
    timers = role_defaults("nvme_storage")["nvme_storage_quiet_timers"]
    candidates = collection_module("kvoffload_quiet_timers").candidates(listing, timers)
    assert sorted(candidates) == ["apt-daily.timer", "e2scrub_all.timer"]


def test_quiet_records_then_stops_then_masks_and_unquiet_undoes_exactly_that(tmp_path: Path) -> None:
    units = {
        "apt-daily.timer": _timer("active", "apt-daily.service"),
        "fstrim.timer": _timer(
            "inactive", "fstrim.service"
        ),  # installed, not scheduled: masked, not restarted
        "man-db.timer": _timer("active", "man-db.service", "masked"),  # an administrator's mask
        "apt-daily.service": {"ActiveState": "inactive"},
        "fstrim.service": {"ActiveState": "inactive"},
    }
    bindir, log = stateful_systemctl(tmp_path, units)
    timers = [
        "apt-daily.timer",
        "fstrim.timer",
        "man-db.timer",
        "logrotate.timer",
    ]  # logrotate: not installed
    result = _quiet(tmp_path, bindir, state="quiet", timers=timers)
    assert result["changed"] is True and not result.get("failed"), result
    record = {"masked": ["apt-daily.timer", "fstrim.timer"], "active": ["apt-daily.timer"],
              "jobs": ["apt-daily.service", "fstrim.service"]}  # fmt: skip
    assert json.loads((tmp_path / "run" / "quiet-timers.json").read_text()) == record
    # stopped before the mask (a timer stopped once masked ends up failed), one reload for the masks
    assert calls(log) == ["stop apt-daily.timer", "daemon-reload"]
    for timer in record["masked"]:
        assert (tmp_path / "runtime" / timer).readlink() == Path("/dev/null")
    assert not (tmp_path / "runtime" / "man-db.timer").exists()
    # a second quiet (another deploy of the node) re-asserts the record and changes nothing
    again = _quiet(tmp_path, bindir, state="quiet", timers=timers)
    assert again["changed"] is False and again["masked"] == record["masked"], again
    assert calls(log) == ["stop apt-daily.timer", "daemon-reload"]
    # a link that is no longer ours is left where it is; the timers that ran start again
    (tmp_path / "runtime" / "fstrim.timer").unlink()
    (tmp_path / "runtime" / "fstrim.timer").symlink_to("/lib/systemd/system/fstrim.timer")
    undone = _quiet(tmp_path, bindir, state="unquiet")
    assert undone["changed"] is True and undone["masked"] == ["apt-daily.timer"], undone
    assert calls(log)[2:] == ["daemon-reload", "start apt-daily.timer"]
    assert not (tmp_path / "runtime" / "apt-daily.timer").exists()
    assert (tmp_path / "runtime" / "fstrim.timer").is_symlink()
    assert not (tmp_path / "run" / "quiet-timers.json").exists()
    assert _quiet(tmp_path, bindir, state="unquiet")["changed"] is False  # no record: nothing to undo


def test_quiet_waits_for_a_job_a_timer_started_and_fails_naming_it(tmp_path: Path) -> None:
    units = {
        "apt-daily-upgrade.timer": _timer("active", "apt-daily-upgrade.service"),
        "apt-daily-upgrade.service": {"ActiveState": "activating"},  # an upgrade under way: never killed
    }
    bindir, log = stateful_systemctl(tmp_path, units)
    result = _quiet(
        tmp_path, bindir, state="quiet", timers=["apt-daily-upgrade.timer"], wait=0.3, interval=0.1
    )
    assert result.get("failed") is True
    assert "apt-daily-upgrade.service" in result["msg"] and "nvme_storage_quiet_wait" in result["msg"]
    assert "stop apt-daily-upgrade.service" not in calls(log)
    # the record was written first, so the teardown still undoes the mask
    assert json.loads((tmp_path / "run" / "quiet-timers.json").read_text())["masked"] == [
        "apt-daily-upgrade.timer"
    ]


def test_check_mode_reports_and_changes_nothing(tmp_path: Path) -> None:
    bindir, log = stateful_systemctl(tmp_path, {"fstrim.timer": _timer("active", "fstrim.service")})
    result = _quiet(tmp_path, bindir, state="quiet", timers=["fstrim.timer"], _ansible_check_mode=True)
    assert result["changed"] is True and result["masked"] == ["fstrim.timer"], result
    assert calls(log) == [] and not (tmp_path / "run").exists() and not (tmp_path / "runtime").exists()


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


def test_a_damaged_record_fails_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    bindir, log = stateful_systemctl(tmp_path, {"fstrim.timer": _timer("active", "fstrim.service")})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "quiet-timers.json").write_text('{"masked": "fstrim.timer"')
    for state in ("quiet", "unquiet"):
        result = _quiet(tmp_path, bindir, state=state, timers=["fstrim.timer"])
        assert result.get("failed") is True, result
        assert (
            "quiet-timers.json: not a record" in result["msg"]
            and "systemctl unmask --runtime" in result["msg"]
        )
    assert calls(log) == []


def test_the_jobs_come_from_each_timers_block_in_systemds_order() -> None:
    # systemctl prints a unit type's own properties (a timer's Unit=) before the generic ones (Id=)
    show = (
        "Unit=apt-daily.service\nId=apt-daily.timer\n\nUnit=fstrim.service\nId=fstrim.timer\n\nId=odd.timer\n"
    )
    jobs = collection_module("kvoffload_quiet_timers").jobs_of(show)
    assert jobs == {"apt-daily.timer": "apt-daily.service", "fstrim.timer": "fstrim.service"}


@pytest.mark.parametrize(
    ("files", "node"),
    [
        ({"nvme0n1/device/numa_node": "1\n"}, 1),  # the controller says
        ({"nvme0n1/device/device/numa_node": "0\n"}, 0),  # only the PCI function says
        ({"nvme0n1/device/numa_node": "-1\n"}, None),  # one node, or the firmware does not say
        ({}, None),  # no sysfs view (containers, loop devices)
    ],
)
def test_blockdev_reports_the_nvme_numa_node(tmp_path: Path, files: dict[str, str], node: int | None) -> None:
    mod = blockdev()
    mod.SYS_CLASS_BLOCK = str(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert mod._numa_node("nvme0n1") == node
