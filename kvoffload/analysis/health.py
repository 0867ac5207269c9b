"""Service health during a cell: Caddy upstream flaps and systemd unit restarts (docs/metrics.md).

Pure: one cell's samples and its cells-table `units` JSON text in, flat dicts out. A flap is a fall of
`caddy_reverse_proxy_upstreams_healthy` from 1 to 0 between two consecutive run samples of one upstream
(Caddy's active and passive health checks marked a replica down); a sample that is already 0 at the
first scrape counts as one flap too, since the replica was down while traffic was offered. Unit restarts
are the `NRestarts` field that the collect role reads with `systemctl show` after the replay: systemd's
automatic restarts of that unit since it was last started on purpose. The orchestrator already turns
restarts of the cell's engine units into faults (cell.json `valid`); this module reports every unit.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvoffload.analysis.series import RUN, labels_of

CADDY_HEALTHY = "caddy_reverse_proxy_upstreams_healthy"
OUR_UNITS = "kvoffload-"


def caddy_flaps(samples: pd.DataFrame) -> dict[str, Any]:
    """`caddy_upstream_flaps` (falls to unhealthy, summed over upstreams; None without Caddy samples) and
    `caddy_flapped_upstreams` (comma list, None when none flapped)."""
    rows = samples[(samples["name"] == CADDY_HEALTHY) & (samples["phase"] == RUN) & samples["value"].notna()]
    if rows.empty:
        return {"caddy_upstream_flaps": None, "caddy_flapped_upstreams": None}
    flaps = 0
    flapped: list[str] = []
    for (_, labels), g in rows.sort_values("ts", kind="stable").groupby(["target", "labels"], sort=True):
        healthy = g["value"].to_numpy(dtype=float) > 0
        falls = int((~healthy[1:] & healthy[:-1]).sum()) + int(not healthy[0])
        if falls:
            flaps += falls
            flapped.append(labels_of(str(labels)).get("upstream", str(labels)))
    return {"caddy_upstream_flaps": flaps, "caddy_flapped_upstreams": ",".join(flapped) or None}


def unit_restarts(units: Any) -> dict[str, Any]:
    """`unit_restarts` (sum of NRestarts over the cell's recorded units; None when none was recorded),
    `service_restarts` (the same over our `kvoffload-*` units: engines, lmcache-server, Caddy) and
    `restarted_units` ("unit on host xN" comma list, None when none restarted)."""
    none = {"unit_restarts": None, "service_restarts": None, "restarted_units": None}
    if not isinstance(units, str) or not units:
        return none
    records: dict[str, Any] = json.loads(units)
    if not records:
        return none
    total = ours = 0
    named: list[str] = []
    for key, state in sorted(records.items()):
        if not isinstance(state, dict):
            continue
        try:
            n = int(state.get("NRestarts") or 0)
        except (TypeError, ValueError):
            continue
        if n > 0:
            host, _, unit = key.partition("--")
            total += n
            ours += n if unit.startswith(OUR_UNITS) else 0
            named.append(f"{unit or host} on {host} x{n}" if unit else f"{host} x{n}")
    return {"unit_restarts": total, "service_restarts": ours, "restarted_units": ", ".join(named) or None}
