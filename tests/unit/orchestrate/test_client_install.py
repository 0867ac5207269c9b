"""Client hosts' installs: each starts after the nodes it waits for, and a failure stays its own."""

from __future__ import annotations

import threading

import pytest

from kvoffload.orchestrate.installs.client_install import ClientInstallFailed, ClientInstalls


def _never() -> bool:
    return False


def test_an_install_starts_after_the_last_node_it_waits_for_and_fails_only_its_own_nodes() -> None:
    ran: list[str] = []
    lock = threading.Lock()

    def install(host: str) -> None:
        with lock:
            ran.append(host)
        if host == "c2":
            raise RuntimeError("pip: no matching distribution")

    installs = ClientInstalls(install)
    installs.add("c1", ["n0", "n1"])
    installs.add("c2", ["n0", "n1"])
    installs.node_installed("n0")
    assert ran == [] and installs.pending("c1") and installs.pending("c2")
    installs.node_installed("n1")
    installs.node_installed("n1")  # a second word about a node changes nothing
    installs.ready("c1", _never)
    with pytest.raises(ClientInstallFailed, match="client host c2 failed: pip: no matching"):
        installs.ready("c2", _never)
    installs.join()
    assert sorted(ran) == ["c1", "c2"] and not installs.pending("c1")
    assert installs.seconds() is not None
    installs.ready("c3", _never)  # a client host with nothing to wait for


def test_a_stop_while_waiting_is_an_interrupt() -> None:
    installs = ClientInstalls(lambda host: None)
    installs.add("c1", ["n0"])  # never started: n0 never says it is installed
    with pytest.raises(KeyboardInterrupt):
        installs.ready("c1", lambda: True)
    assert installs.seconds() is None
