"""Routing figures of one cell, counted from its request records and cell.json targets."""

from __future__ import annotations

import pandas as pd

from kvoffload.analysis.routing import routing_figures

TARGETS = {"vllm-0": {"kind": "vllm"}, "vllm-1": {"kind": "vllm"}, "node": {"kind": "node"}}


def test_users_on_several_replicas_and_records_without_one() -> None:
    requests = pd.DataFrame(
        {
            "user_id": ["a", "a", "b", "b", "c"],
            "replica": ["h:8001", "h:8002", "h:8002", "h:8002", None],
        }
    )
    assert routing_figures(requests, TARGETS) == {
        "replicas_configured": 2,
        "replicas_answering": 2,
        "routed_users": 2,
        "users_on_several_replicas": 1,
        "requests_without_replica": 1,
    }


def test_records_without_the_replica_field_leave_the_counts_unknown() -> None:
    out = routing_figures(pd.DataFrame({"user_id": ["a"]}), {})
    assert out == dict.fromkeys(
        (
            "replicas_configured",
            "replicas_answering",
            "routed_users",
            "users_on_several_replicas",
            "requests_without_replica",
        )
    )


def test_no_records_say_nothing_about_routing() -> None:
    # an empty requests.jsonl: not "no replica answered" (0) but unknown
    out = routing_figures(pd.DataFrame({"user_id": [], "replica": []}), TARGETS)
    assert out["replicas_configured"] == 2
    assert out["replicas_answering"] is None and out["routed_users"] is None
