"""The client pool: which client host replays which node, and the streams and cores that asks."""

from __future__ import annotations

from kvoffload.cli import replay as replay_cli
from kvoffload.config.clients import (
    STREAMS_PER_CORE,
    assign_clients,
    client_loads,
    clients_needed,
    cores_needed,
)
from kvoffload.config.inventory import Host, HostVars
from kvoffload.replay import workers


def _host(name: str, groups: tuple[str, ...], client: str | None = None) -> Host:
    return Host(name, frozenset(groups), HostVars(kvoffload_client=client))


def test_nodes_are_shared_out_evenly_in_inventory_order() -> None:
    nodes = [_host(f"n{i}", ("vllm",)) for i in range(5)]
    clients = [_host("c1", ("client",)), _host("c2", ("client",))]
    assert assign_clients(nodes, clients) == {"n0": "c1", "n1": "c2", "n2": "c1", "n3": "c2", "n4": "c1"}


def test_a_named_client_host_counts_before_the_others_are_shared_out() -> None:
    nodes = [_host("n0", ("vllm",)), _host("n1", ("vllm",)), _host("n2", ("vllm",), client="c1")]
    clients = [_host("c1", ("client",)), _host("c2", ("client",))]
    # n2 is c1's already, so the first free node goes to c2, the next to the less loaded again.
    assert assign_clients(nodes, clients) == {"n2": "c1", "n0": "c2", "n1": "c1"}


def test_peak_streams_add_up_over_a_client_hosts_nodes() -> None:
    loads = client_loads({"n0": "c1", "n1": "c1", "n2": "c2"}, ["c1", "c2", "c3"], {"n0": 256, "n1": 64})
    assert [(x.client, x.nodes, x.peak_streams) for x in loads] == [
        ("c1", ("n0", "n1"), 320),
        ("c2", ("n2",), 0),
        ("c3", (), 0),
    ]
    assert loads[0].cores_needed == 4  # ceil(320 / 128) + one spare


def test_a_host_is_short_only_when_its_cores_are_known_and_too_few() -> None:
    loads = client_loads({"n0": "c1", "n1": "c2"}, ["c1", "c2"], {"n0": 512, "n1": 512}, {"c1": 4})
    assert loads[0].short and not loads[1].short  # c2's cores are not known
    assert clients_needed(loads, cores_per_client=4) == 3  # 1024 streams at 3 x 128 a host
    assert cores_needed(0) == 1 and cores_needed(1) == 2 and cores_needed(STREAMS_PER_CORE) == 2


def test_the_budget_is_the_replay_workers_figure() -> None:
    assert STREAMS_PER_CORE == workers.STREAMS_PER_WORKER == replay_cli.STREAMS_PER_WORKER
