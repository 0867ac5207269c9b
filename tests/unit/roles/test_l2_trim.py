"""lmcache_server's fstrim after each end-of-cell L2 wipe (tasks/trim_l2.yml): the teardown's wipe and
the collect's clear for a next cell include it, the clear right before a replay does not; and the fact
kvoffload-lab records in cell.json says trimmed, unsupported or failed from fstrim's own answers.

The command needs a mounted file system and CAP_SYS_ADMIN; here the fact's expressions are templated as
Ansible does, against the results fstrim gives (util-linux 2.38)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, role_defaults

TASKS = ROLES / "lmcache_server" / "tasks"


def _tasks(name: str) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = yaml.safe_load((TASKS / name).read_text())
    return tasks


PLAYBOOKS = ROLES.parent / "playbooks"


def _play(playbook: str, name: str) -> list[dict[str, Any]]:
    plays = yaml.safe_load((PLAYBOOKS / playbook).read_text())
    tasks: list[dict[str, Any]] = next(p for p in plays if p["name"] == name)["tasks"]
    return tasks


def _includes(tasks: list[dict[str, Any]]) -> list[str]:
    """The lmcache_server task files a play's tasks include, in order."""
    return [
        t["ansible.builtin.include_role"]["tasks_from"]
        for t in tasks
        if t.get("ansible.builtin.include_role", {}).get("name") == "lmcache_server"
    ]


def test_the_end_of_cell_wipes_trim_and_the_clear_before_a_replay_does_not() -> None:
    """XFS's FITRIM discards all free space on every call: a trim right before the replay (the clear of a
    reset's probes) would leave the SSD working through a whole-drive deallocate under the nvme cells after
    a reset only, and not under the others."""
    # the teardown's wipe, after the server stopped
    assert _tasks("teardown_l2.yml")[-1]["ansible.builtin.include_tasks"] == "trim_l2.yml"
    # the collect's clear for a next cell that keeps the engines: the clear, then the trim, on one switch
    collect = _play("collect.yml", "Empty L2 for the next cell, which keeps these engines")
    assert _includes(collect) == ["clear_l2.yml", "trim_l2.yml"]
    assert {t["when"] for t in collect} == {"kvoffload_clear_l2_next | default(false) | bool"}
    # right before the replay: the clear alone, and the clear itself includes no trim
    assert _includes(_play("replay.yml", "Empty L2 of the reset's probes")) == ["clear_l2.yml"]
    assert not any("trim_l2.yml" in str(t) for t in _tasks("clear_l2.yml"))


@pytest.mark.parametrize(
    ("registered", "outcome", "message"),
    [
        ({"rc": 0, "stdout": "/mnt/kvoffload-nvme: 1.2 GiB (1288490188 bytes) trimmed", "stderr": ""},
         "trimmed", "/mnt/kvoffload-nvme: 1.2 GiB (1288490188 bytes) trimmed"),
        ({"rc": 1, "stdout": "", "stderr": "fstrim: /mnt/kvoffload-nvme: the discard operation is not supported"},
         "unsupported", "fstrim: /mnt/kvoffload-nvme: the discard operation is not supported"),
        ({"rc": 1, "stdout": "", "stderr": "fstrim: /mnt/kvoffload-nvme: FITRIM ioctl failed: Operation not permitted"},
         "failed", "fstrim: /mnt/kvoffload-nvme: FITRIM ioctl failed: Operation not permitted"),
        ({"rc": 2, "failed": True, "msg": "[Errno 2] No such file or directory: b'fstrim'"},
         "failed", "[Errno 2] No such file or directory: b'fstrim'"),
    ],
)  # fmt: skip
def test_the_trim_fact_names_the_outcome(registered: dict[str, Any], outcome: str, message: str) -> None:
    trim, record = _tasks("trim_l2.yml")
    assert trim["ansible.builtin.command"]["argv"][:2] == ["fstrim", "--verbose"]
    assert trim["failed_when"] is False  # after the measurement: recorded, never failing the cell
    variables = {
        **role_defaults("lmcache_server"),
        "lmcache_server_l2_path": "/mnt/kvoffload-nvme/lmcache-l2",
        "_lmcache_server_trim": registered,
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    spec = record["ansible.builtin.set_fact"]["lmcache_server_l2_trim_result"]
    got = {key: templar.template(trust_as_template(value)) for key, value in spec.items()}
    assert got == {"path": "/mnt/kvoffload-nvme", "outcome": outcome, "message": message}
