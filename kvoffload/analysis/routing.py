"""How requests were routed to a cell's replicas, read from the request records (docs/metrics.md
"Validity rules").

Pure: one cell's request records (`user_id`, `round`, `replica`) and its cell.json `targets` in, a few
summary figures out. `replica` is what answered a request (the simulator's `x-kvoffload-replica` header,
else Caddy's `x-kvoffload-upstream`, docs/contracts.md); a record without it (a failed request that no
replica answered, or a single real replica without Caddy) says nothing about routing and is counted
apart. The rules that judge these figures (sticky on the gpu tier, spread on cpu and nvme) live in
kvoffload/analysis/compare.py with the other validity rules; this module only counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

ROUTING_COLUMNS = (
    "replicas_configured",
    "replicas_answering",
    "routed_users",
    "users_on_several_replicas",
    "requests_without_replica",
)


def replicas_configured(targets: Mapping[str, Mapping[str, Any]]) -> int | None:
    """vLLM replicas the cell sampled (cell.json `targets` of kind `vllm`); None when it lists none."""
    n = sum(1 for t in targets.values() if isinstance(t, Mapping) and t.get("kind") == "vllm")
    return n or None


def routing_figures(requests: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The routing figures of one cell (ROUTING_COLUMNS).

    `replicas_answering`: distinct replicas named by the records; `routed_users`: users with at least
    one record naming a replica; `users_on_several_replicas`: those whose records name more than one;
    `requests_without_replica`: records naming none. Counts are None when the records lack the column
    or there are none (an empty requests.jsonl says nothing about routing: docs/metrics.md, Null rules).
    """
    out: dict[str, Any] = {"replicas_configured": replicas_configured(targets)}
    if requests.empty or "replica" not in requests.columns or "user_id" not in requests.columns:
        return out | {k: None for k in ROUTING_COLUMNS[1:]}
    named = requests[requests["replica"].notna()]
    per_user = named.groupby("user_id", sort=False)["replica"].nunique()
    out["replicas_answering"] = int(named["replica"].nunique())
    out["routed_users"] = len(per_user)
    out["users_on_several_replicas"] = int((per_user > 1).sum())
    out["requests_without_replica"] = int(len(requests) - len(named))
    return out
