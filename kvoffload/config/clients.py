"""Which client host replays each node's cells, and how many streams each client host must drive.

Part of kvoffload.config (pure: no IO). The inventory's `client` group may hold several hosts. Each
node (host of group vllm) is replayed from one of them: the one its `kvoffload_client` host variable
names, else the client host with the fewest nodes so far (inventory order breaks ties), so the pool is
shared evenly. A node keeps its client host for the whole run, so the cells of a tier comparison (one
node's) never change client host.

A client host's load is the streams it holds open at once: its nodes run their cells in parallel, one
cell at a time each, so its peak is the sum over its nodes of the largest concurrency of a cell
scheduled there. `STREAMS_PER_CORE` is how many streams one core of the replay client drives with a
sub-millisecond TTFT error (bench/replay_fidelity.py, figures in docs/lab.md "Sizing the client
pool"); the replay leaves one core for everything else, as its worker count does
(kvoffload/replay/workers.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvoffload.config.inventory import Host, Inventory

CLIENT_VAR = "kvoffload_client"
# Streams one replay worker (one core) drives with a p99 TTFT error under 1 ms at 5-30 ms between
# tokens: kvoffload.replay.workers.STREAMS_PER_WORKER, which tests/unit/config pins to this figure.
STREAMS_PER_CORE = 128


def assign_clients(nodes: Sequence[Host], clients: Sequence[Host]) -> dict[str, str]:
    """node name -> client host name: each node's `kvoffload_client`, the others spread evenly."""
    names = [c.name for c in clients]
    load = dict.fromkeys(names, 0)
    out: dict[str, str] = {}
    for node in nodes:
        chosen = node.vars.kvoffload_client
        if chosen in load:
            out[node.name] = chosen
            load[chosen] += 1
    for node in nodes:
        if node.name not in out and names:
            chosen = min(names, key=lambda n: (load[n], names.index(n)))
            out[node.name] = chosen
            load[chosen] += 1
    return out


def client_problems(inv: Inventory) -> list[str]:
    """What is wrong with the client group and the nodes' `kvoffload_client`; all at once."""
    f = inv.file
    clients = inv.group("client")
    if not clients:
        return [f"{f}: all.children.client: needs at least one host to replay from, has none"]
    names = [c.name for c in clients]
    problems = []
    for host in inv.hosts:
        chosen = host.vars.kvoffload_client
        if chosen is None:
            continue
        if "vllm" not in host.groups:
            problems.append(
                f"{f}: host {host.name}: {CLIENT_VAR} is set, but the host is not a node (group vllm): "
                "set it on the node whose cells that client host should replay"
            )
        elif chosen not in names:
            problems.append(
                f"{f}: host {host.name}: {CLIENT_VAR}: {chosen!r} is not in group client "
                f"({', '.join(names)}): name one of those, or add {chosen} to all.children.client"
            )
    return problems


def cores_needed(streams: int) -> int:
    """Cores a client host needs for `streams` at once with sub-millisecond error (one spare)."""
    return math.ceil(streams / STREAMS_PER_CORE) + 1 if streams > 0 else 1


@dataclass(frozen=True)
class ClientLoad:
    """One client host's share of a run: its nodes and the streams it holds open at most."""

    client: str
    nodes: tuple[str, ...]
    peak_streams: int
    cores: int | None  # the host's cores where known (cell.json facts of an earlier run), else None

    @property
    def cores_needed(self) -> int:
        return cores_needed(self.peak_streams)

    @property
    def short(self) -> bool:
        """Whether the host is known to have fewer cores than its streams need."""
        return self.cores is not None and self.cores < self.cores_needed


def client_loads(
    assignment: Mapping[str, str],
    clients: Sequence[str],
    node_concurrency: Mapping[str, int],
    cores: Mapping[str, int] | None = None,
) -> list[ClientLoad]:
    """Per client host (in `clients` order): its nodes and peak streams, from the largest concurrency
    of a cell scheduled on each node (`node_concurrency`; a node with nothing to run holds none)."""
    known = cores or {}
    out = []
    for client in clients:
        nodes = tuple(n for n, c in assignment.items() if c == client)
        peak = sum(node_concurrency.get(n, 0) for n in nodes)
        out.append(ClientLoad(client, nodes, peak, known.get(client)))
    return out


def clients_needed(loads: Sequence[ClientLoad], cores_per_client: int) -> int:
    """How many client hosts of `cores_per_client` cores the run's streams need at sub-millisecond error."""
    total = sum(load.peak_streams for load in loads)
    per_host = max(1, cores_per_client - 1) * STREAMS_PER_CORE
    return max(1, math.ceil(total / per_host))
