"""The client host's install when it runs beside the nodes' first deploys (kvoffload/orchestrate/campaign.py
`_prepare`): it starts once every node of the run has installed its own software (so that the pip runs
never share a host's cores) and every replay waits for it (kvoffload/orchestrate/cell_run.py).

Thread-safe: the node threads report their installs and wait on it; the install runs in a thread of its
own. The playbook it runs is the campaign's (`install`); this module only sequences.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any


class ClientInstall:
    """Idle until `expect`; then started by the last node's `node_installed`."""

    def __init__(self, install: Callable[[Mapping[str, Any]], None], stopping: Callable[[], bool]) -> None:
        self._install = install
        self._stopping = stopping
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._after: frozenset[str] = frozenset()  # the nodes whose installs it still waits for
        self._extravars: Mapping[str, Any] | None = None
        self._done: threading.Event | None = None
        self._error: BaseException | None = None

    def expect(self, extravars: Mapping[str, Any], nodes: Collection[str]) -> None:
        """Install the client with `extravars` once every one of `nodes` has installed."""
        self._extravars = extravars
        self._after = frozenset(nodes)
        self._done = threading.Event()

    def node_installed(self, node: str) -> None:
        """`node`'s install is over (or will not happen): the client's starts after the last one."""
        with self._lock:
            if node not in self._after:
                return
            self._after -= {node}
            if self._after or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="install-client")
        self._thread.start()

    def _run(self) -> None:
        assert self._extravars is not None and self._done is not None
        try:
            self._install(self._extravars)
        except BaseException as exc:  # handed to the replays waiting for it
            self._error = exc
        finally:
            self._done.set()

    def pending(self) -> bool:
        return self._done is not None and not self._done.is_set()

    def ready(self) -> None:
        """Before a replay: wait for the client's install; a failed one fails the cell."""
        if self._done is None:
            return
        while not self._done.wait(0.5):
            if self._stopping():
                raise KeyboardInterrupt
        if isinstance(self._error, KeyboardInterrupt):  # PlaybookCanceled too: a stop
            raise KeyboardInterrupt
        if self._error is not None:
            raise RuntimeError(f"the client host's install failed: {self._error}")

    def join(self) -> None:
        """Wait for a started install (canceled with the cells when the run stops)."""
        if self._thread is not None:
            self._thread.join()
