"""playbooks/host_python.yml through the ansible-runner facade on localhost (connection local): the
version `run` builds the wheelhouse for when --hosts-python is not given. One playbook run."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from kvoffload.orchestrate.installs.host_python import learn_hosts_python
from kvoffload.playbook import PlaybookRunner

pytestmark = pytest.mark.integration


def test_the_hosts_python_comes_back_through_the_facade(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    # two hosts of the groups provision's Python check covers, both this interpreter
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        "    ansible_python_interpreter: \"{{ ansible_playbook_python }}\"\n"
        "  children:\n    vllm:\n      hosts:\n        node1:\n    client:\n      hosts:\n        client1:\n"
    )  # fmt: skip
    runner = PlaybookRunner(inventory, tmp_path / "art")
    assert learn_hosts_python(runner) == platform.python_version()
    assert (tmp_path / "art" / "artifacts" / "host-python" / "job_events").is_dir()
