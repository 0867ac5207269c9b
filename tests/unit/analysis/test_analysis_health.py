"""Caddy upstream flaps and systemd unit restarts."""

from __future__ import annotations

import json

from kvoffload.analysis.health import caddy_flaps, unit_restarts
from tests.unit.analysis.analysis_frames import samples_frame

NAME = "caddy_reverse_proxy_upstreams_healthy"


def test_flaps_count_falls_to_unhealthy_per_upstream() -> None:
    a, b = {"upstream": "10.0.0.1:8000"}, {"upstream": "10.0.0.1:8001"}
    values_a = [1, 0, 0, 1, 0, 1]  # two falls
    values_b = [0, 1, 1, 1, 1, 1]  # down at the first scrape: one
    rows = [("run", 15 * i, "caddy", NAME, a, float(v)) for i, v in enumerate(values_a)]
    rows += [("run", 15 * i, "caddy", NAME, b, float(v)) for i, v in enumerate(values_b)]
    rows.append(("before", -1, "caddy", NAME, a, 0.0))  # snapshots are not the run
    f = caddy_flaps(samples_frame(rows))
    assert f["caddy_upstream_flaps"] == 3
    assert f["caddy_flapped_upstreams"] == "10.0.0.1:8000,10.0.0.1:8001"
    steady = [("run", 15 * i, "caddy", NAME, a, 1.0) for i in range(4)]
    assert caddy_flaps(samples_frame(steady)) == {"caddy_upstream_flaps": 0, "caddy_flapped_upstreams": None}
    assert caddy_flaps(samples_frame([]))["caddy_upstream_flaps"] is None  # no Caddy: unknown, not 0


def test_unit_restarts_split_ours_from_exporters() -> None:
    units = {
        "gpu1--kvoffload-vllm@0.service": {"NRestarts": "2", "ActiveState": "active"},
        "gpu1--kvoffload-lmcache.service": {"NRestarts": "0"},
        "client--prometheus-node-exporter.service": {"NRestarts": "1"},
        "gpu1--broken.service": {"error": "unreadable broken.service.json"},
    }
    r = unit_restarts(json.dumps(units))
    assert r["unit_restarts"] == 3 and r["service_restarts"] == 2
    assert r["restarted_units"] == (
        "prometheus-node-exporter.service on client x1, kvoffload-vllm@0.service on gpu1 x2"
    )
    assert unit_restarts("{}")["unit_restarts"] is None
    assert unit_restarts(None)["service_restarts"] is None
