"""lmcache_server's preflight refuses an L1 pool that, with the replicas beside it, does not fit in the
host's memory (L1 is pinned: a failed pin only logs a warning, and the OOM comes mid-cell).

The task's expressions are templated as Ansible does, against a recorded /proc/meminfo (slurp's base64)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, role_defaults

TASK = "Check that L1 and the replicas fit in the host's memory"
# The first lines of an H200 node's /proc/meminfo (2 TiB): MemTotal in kB.
MEMINFO = "MemTotal:       2113407616 kB\nMemFree:        2051246180 kB\nMemAvailable:   2074114008 kB\n"


def _check(variables: dict[str, Any]) -> tuple[bool, str]:
    tasks = yaml.safe_load((ROLES / "lmcache_server" / "tasks" / "preflight.yml").read_text())
    task = next(t for t in tasks if t["name"] == TASK)
    merged = {**role_defaults("lmcache_server"), **variables}
    merged.update({k: trust_as_template(v) for k, v in task["vars"].items()})
    templar = Templar(loader=DataLoader(), variables=merged)
    ok = templar.template(trust_as_template("{{ " + task["ansible.builtin.assert"]["that"] + " }}"))
    return bool(ok), str(templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"])))


def _node(l1_gb: float, replicas: int, meminfo: str = MEMINFO, **more: Any) -> dict[str, Any]:
    return {
        "kvoffload_engine": "vllm",
        "kvoffload_engine_build": "cuda",
        "lmcache_server_args": ["--port", "5555", "--l1-size-gb", f"{l1_gb:g}", "--chunk-size", "256"],
        "vllm_replicas": [{"index": i, "gpus": str(i)} for i in range(replicas)],
        "group_names": ["lmcache", "vllm", "lb"],
        "inventory_hostname": "gpu01",
        "_lmcache_server_meminfo": {"content": base64.b64encode(meminfo.encode()).decode()},
        **more,
    }


@pytest.mark.parametrize(
    ("l1_gb", "replicas", "fits"),
    [
        (200, 8, True),  # the example lab: 200 + 8 x 2 processes x 4 + 4 = 268 GiB of 2015.5
        (1940, 8, True),  # 2008 GiB needed
        (1950, 8, False),  # 2018 GiB needed
        (1990, 2, True),  # 2010 GiB: fewer replicas leave more room
    ],
)
def test_l1_and_the_replicas_must_fit_in_memtotal(l1_gb: float, replicas: int, fits: bool) -> None:
    ok, message = _check(_node(l1_gb, replicas))
    assert ok is fits
    if not fits:
        assert "gpu01 has 2015.5 GiB of memory" in message
        assert "+ 8 replica(s) with 16 engine process(es) x 4 GiB + 4 GiB" in message
        assert "need 2018.0 GiB" in message
        for variable in (
            "lmcache_l1_size_gb",
            "l1_size_gb",
            "vllm_replicas",
            "lmcache_server_engine_process_host_memory_gb",
        ):
            assert variable in message


def test_a_tensor_parallel_replica_counts_a_process_per_rank() -> None:
    """One TP-8 replica is 10 processes (API server, EngineCore, 8 workers), not one replica's worth."""
    tp8 = {"vllm_replicas": [{"index": 0, "gpus": "0,1,2,3,4,5,6,7"}]}
    # 1960 + 10 x 4 + 4 = 2004 GiB of 2015.5: fits; counted as one replica (8 GiB) it fitted at 1990 too
    assert _check(_node(1960, 1, **tp8))[0] is True
    ok, message = _check(_node(1990, 1, **tp8))  # 2034 GiB
    assert ok is False
    assert (
        "+ 1 replica(s) with 10 engine process(es) x 4 GiB + 4 GiB for the OS and the server need 2034.0 GiB"
        in (message)
    )
    # two TP-2 replicas and one TP-1: 3 x 2 + 2 + 2 = 10 processes
    mixed = {
        "vllm_replicas": [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "2,3"}, {"index": 2, "gpus": "4"}]
    }
    assert "with 10 engine process(es)" in _check(_node(1990, 1, **mixed))[1]
    # the simulator serves a replica from one process, whatever its TP flag
    sim = _check(_node(1990, 1, kvoffload_engine="sim", **tp8))[1]
    assert "with 1 engine process(es) x 0.5 GiB" in sim


def test_the_per_process_figure_follows_the_engine_and_can_be_set() -> None:
    small = "MemTotal:       25165824 kB\n"  # 24 GiB: the virtual lab's machine
    cpu_build = {"kvoffload_engine_build": "cpu"}
    assert _check(_node(8, 2, small, **cpu_build))[0] is True  # 8 + 2 x 2 x 1.5 + 4 = 18
    assert _check(_node(8, 2, small))[0] is False  # CUDA: 8 + 2 x 2 x 4 + 4 = 28
    assert _check(_node(8, 2, small, kvoffload_engine="sim"))[0] is True  # 2 x 0.5 + 4
    # the simulator never allocates its L1 (the virtual lab's campaigns ask for 64 GiB on 24)
    assert _check(_node(64, 2, small, kvoffload_engine="sim"))[0] is True
    # 8 + 2 x 2 x 2.5 + 4 = 22
    assert _check(_node(8, 2, small, lmcache_server_engine_process_host_memory_gb=2.5))[0] is True
    # a cache host that runs no replica counts none
    assert _check(_node(18, 2, small, group_names=["lmcache"]))[0] is True
