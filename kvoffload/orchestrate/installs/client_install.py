"""The client hosts' installs of a run: one per client host, each beside the nodes' first deploys.

Part of the orchestrator (kvoffload/orchestrate/campaign/runner.py starts and waits on it). A client host's
install (replay.yml, tag install, limited to that host) starts once every node of the run has
installed its own software, so that the pip runs never share cores, and runs while the nodes start
their first engines; a client host that is also a node's host installs at once, alone (`run_now`). A
client host installs once per run, whichever part of the run first replays from it (`covers`: a
resumed run's knee search may replay from a client host none of the run's cells used). A replay waits
for its own client host's install only; a failed install fails the cells of the nodes that client host
replays, and no other node's. The playbook runs through the `install` callable the campaign gives (it
knows the extravars, idents and cancel hook).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

Install = Callable[[str], None]  # runs one client host's install; raises when it fails


class ClientInstallFailed(RuntimeError):
    """The install of the client host that replays a node's cells failed."""


class _One:
    """One client host's install: the nodes it still waits for, its thread and how it ended."""

    def __init__(self, host: str, after: Collection[str]) -> None:
        self.host = host
        self.after = set(after)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.seconds: float | None = None


class ClientInstalls:
    """The installs of the run's client hosts that wait for the nodes (`add`), started as the last
    node each waits for is installed (`node_installed`), awaited per client host (`ready`)."""

    def __init__(self, install: Install) -> None:
        self._install = install
        self._lock = threading.Lock()
        self._by_host: dict[str, _One] = {}

    def add(self, host: str, after: Collection[str]) -> None:
        """Install `host` once every node in `after` is installed."""
        with self._lock:
            self._by_host[host] = _One(host, after)

    def covers(self, host: str) -> bool:
        """Whether this run installs (or installed, or failed to install) `host` already."""
        with self._lock:
            return host in self._by_host

    def run_now(self, host: str) -> None:
        """Install `host` in this thread, now; raises what the install raised."""
        one = _One(host, ())
        with self._lock:
            self._by_host[host] = one
        self._run(one)
        if one.error is not None:
            raise one.error

    def node_installed(self, node: str) -> None:
        """`node`'s install is over (or will not happen): start the installs that waited for it last."""
        starting = []
        with self._lock:
            for one in self._by_host.values():
                if node not in one.after:
                    continue
                one.after.discard(node)
                if not one.after and one.thread is None:
                    one.thread = threading.Thread(target=self._run, args=(one,), name=f"install-{one.host}")
                    starting.append(one.thread)
        for thread in starting:
            thread.start()

    def _run(self, one: _One) -> None:
        t0 = time.monotonic()
        try:
            self._install(one.host)
        except BaseException as exc:  # handed to the replays waiting for it
            one.error = exc
        finally:
            one.seconds = round(time.monotonic() - t0, 3)
            one.done.set()

    def pending(self, host: str) -> bool:
        """Whether `host` has an install that has not ended yet."""
        one = self._by_host.get(host)
        return one is not None and not one.done.is_set()

    def ready(self, host: str, stopping: Callable[[], bool]) -> None:
        """Wait for `host`'s install; KeyboardInterrupt when the run stops or the install was canceled,
        ClientInstallFailed when it failed. A host with no install waiting returns at once."""
        one = self._by_host.get(host)
        if one is None:
            return
        while not one.done.wait(0.5):
            if stopping():
                raise KeyboardInterrupt
        if isinstance(one.error, KeyboardInterrupt):  # PlaybookCanceled too: a stop
            raise KeyboardInterrupt
        if one.error is not None:
            raise ClientInstallFailed(f"the install of client host {host} failed: {one.error}")

    def join(self) -> None:
        """Wait for every started install (they are canceled with the cells when the run stops)."""
        for one in list(self._by_host.values()):
            if one.thread is not None:
                one.thread.join()

    def seconds(self) -> float | None:
        """The longest install's wall time (the client's share of the run), None when none ran."""
        times = [one.seconds for one in self._by_host.values() if one.seconds is not None]
        return max(times) if times else None
