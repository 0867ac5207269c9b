"""Hosts without an address: `plan` and `run` exit 2 naming the file, the host and ansible_host, before
any host is touched (issue 43, defect 12: such a host used to pass `plan` and fail `run` after the other
hosts were provisioned). An address is the host's ansible_host, else its inventory name: an IPv4 address,
or a name this machine resolves (docs/contracts.md "Host addresses"). The resolver is replaced by a fake
here (the corpus's traps refuse a real name lookup); one test asks the real one for `localhost`.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from kvoffload.config import load_lab
from kvoffload.errors import UserError
from kvoffload.orchestrate.checks import controller as checks
from tests.unit.badinput.labs import CLIENT, NODE, Lab, assert_plan_and_run_refuse

UNKNOWN = "Name or service not known"


def _resolver(monkeypatch: pytest.MonkeyPatch, known: set[str]) -> list[str]:
    """This machine's resolver as a fake that knows `known`; returns the names it was asked."""
    asked: list[str] = []
    lock = threading.Lock()

    def lookup(name: str) -> None:
        with lock:
            asked.append(name)
        if name not in known:
            raise socket.gaierror(socket.EAI_NONAME, UNKNOWN)

    monkeypatch.setattr(checks, "lookup", lookup)
    return asked


def test_a_host_without_ansible_host_whose_name_does_not_resolve_is_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(tmp_path, inline=False)
    del lab.hosts()[CLIENT]["ansible_host"]
    asked = _resolver(monkeypatch, known=set())
    needle = (
        f"{{inv}}: host {CLIENT}: ansible_host is missing, and the inventory name '{CLIENT}' is no IPv4 "
        f"address and does not resolve on this machine ({UNKNOWN}): give the host's address as its "
        "ansible_host (an IPv4 address, or a name that resolves here and on the lab's hosts)"
    )
    assert_plan_and_run_refuse(lab, (needle,), capsys, monkeypatch)
    assert asked == [CLIENT, CLIENT]  # plan, then run; the hosts with an IPv4 ansible_host are not asked


def test_an_ansible_host_that_does_not_resolve_is_refused_where_it_is_written(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(tmp_path, inline=False)
    lab.extra[f"host_vars/{NODE}.yml"] = b"ansible_host: gpu01.nowhere.test\n"
    _resolver(monkeypatch, known=set())
    needle = (
        f"{{root}}/host_vars/{NODE}.yml: ansible_host: 'gpu01.nowhere.test' does not resolve on this "
        f"machine ({UNKNOWN}): give the host's IPv4 address, or a name that resolves here"
    )
    assert_plan_and_run_refuse(lab, (needle,), capsys, monkeypatch)


def test_an_ipv6_inventory_name_without_ansible_host_is_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(tmp_path, inline=False)
    lab.hosts()["2001:db8::21"] = None
    lab.children()["client"]["hosts"]["2001:db8::21"] = None
    asked = _resolver(monkeypatch, known=set())
    needle = "{inv}: host 2001:db8::21: ansible_host is missing, and the inventory name is an IPv6 literal"
    assert_plan_and_run_refuse(lab, (needle,), capsys, monkeypatch)
    assert asked == []


def test_an_ipv4_name_or_a_name_that_resolves_is_an_address(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The virtual lab's inventories give every host an IPv4 ansible_host (kvoffload/lab/inventory.py):
    nothing is asked then; a name given without ansible_host is asked once, and passes when it resolves."""
    lab = Lab(tmp_path, inline=False)
    del lab.hosts()[CLIENT]["ansible_host"]
    lab.hosts()["192.0.2.22"] = None
    lab.children()["client"]["hosts"]["192.0.2.22"] = None
    args = lab.write()
    asked = _resolver(monkeypatch, known={CLIENT})
    loaded = load_lab(args[0], args[2])
    checks.check_host_addresses(loaded.inventory)
    assert asked == [CLIENT]
    assert {h.name: h.address for h in loaded.inventory.hosts}[CLIENT] == CLIENT


def test_a_resolver_that_does_not_answer_in_time_counts_as_unresolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never = threading.Event()

    def hangs(_name: str) -> None:
        never.wait(5)

    monkeypatch.setattr(checks, "lookup", hangs)
    try:
        assert checks.unresolved(["slow.lab"], timeout_s=0.05) == {
            "slow.lab": "no answer from this machine's resolver in 0.05 s"
        }
    finally:
        never.set()


def test_the_real_resolver_resolves_localhost_and_not_a_bad_name() -> None:
    # "localhost" comes from /etc/hosts (no DNS); a name with a space is refused by getaddrinfo itself
    failed = checks.unresolved(["localhost", "no such host"])
    assert list(failed) == ["no such host"] and failed["no such host"]


def test_the_error_is_a_user_error_with_every_problem(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = Lab(tmp_path, inline=False)
    for host in (NODE, CLIENT):
        del lab.hosts()[host]["ansible_host"]
    args = lab.write()
    _resolver(monkeypatch, known=set())
    with pytest.raises(UserError) as caught:
        checks.check_host_addresses(load_lab(args[0], args[2]).inventory)
    lines = str(caught.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == [f"host {NODE}", f"host {CLIENT}"]
