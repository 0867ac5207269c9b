"""lmcache_server's fstrim after each L2 wipe (tasks/trim_l2.yml): both wipes include it, and the fact
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


@pytest.mark.parametrize("wipe", ["clear_l2.yml", "teardown_l2.yml"])
def test_every_wipe_of_l2_ends_with_the_trim(wipe: str) -> None:
    last = _tasks(wipe)[-1]
    assert last["ansible.builtin.include_tasks"] == "trim_l2.yml"


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
