"""The campaign's latency target (`slo`) and prices: validation, the knee search's limits, and where a
lab's prices come from (kvoffload/config/slo.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError, load_lab
from kvoffload.config.campaign import SLO_REPEATS
from kvoffload.config.cells import resolve_cells
from kvoffload.config.errors import KeyedError
from kvoffload.config.slo import Prices, lab_prices

Writer = Callable[[str, Any], Path]


def _problems(write_yaml: Writer, inventory: dict[str, Any], campaign: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    return {p.split(": ")[1]: p.split(": ", 2)[2] for p in info.value.problems}


def test_slo_keys_are_checked_and_named(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["slo"] = {"ttft_p50_s": 0.2, "tpot_p95": 0.05}
    by_key = _problems(write_yaml, inventory, campaign)
    assert by_key["slo.ttft_p95_s"] == "required key is missing"
    assert by_key["slo.tpot_p95"].startswith("unknown key; did you mean 'tpot_p95_s'?")


def test_a_p50_target_above_the_p95_one_names_both(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["slo"] = {"ttft_p95_s": 0.5, "ttft_p50_s": 0.8}
    assert _problems(write_yaml, inventory, campaign) == {
        "slo.ttft_p50_s": "0.8 s is above ttft_p95_s 0.5 s: a median cannot exceed the 95th percentile, so "
        "the p95 limit could never bind; lower ttft_p50_s or raise ttft_p95_s"
    }


def test_prices_need_one_price_and_no_negative_one(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["prices"] = {"currency": "EUR"}
    assert _problems(write_yaml, inventory, campaign) == {
        "prices.node_hour": "give at least one price (node_hour, gpu_hour, dram_gb_month, nvme_tb_month, "
        "kwh), or leave out prices"
    }
    campaign["prices"] = {"node_hour": -1.0}
    assert "prices.node_hour" in _problems(write_yaml, inventory, campaign)


def test_the_target_is_given_once(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["slo"] = {"ttft_p95_s": 0.5}
    campaign["knee_search"] = {"slo_p95_ttft_s": 0.4}
    assert _problems(write_yaml, inventory, campaign) == {
        "knee_search.slo_p95_ttft_s": "the target is set in slo (slo.ttft_p95_s, slo.min_later_hit_rate), "
        "which the knee search and the report share: remove knee_search.slo_p95_ttft_s"
    }


def test_slo_turns_the_knee_search_on_with_its_limits(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["slo"] = {"ttft_p95_s": 0.5, "min_later_hit_rate": 0.4}
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    spec = lab.campaign.knee_spec()
    assert spec is not None and spec.max_concurrency == 1024 and spec.factor == 2.0
    assert lab.campaign.knee_limits() == (0.5, 0.4)
    # knee_search keeps the ramp's own settings, and can turn it off
    campaign["knee_search"] = {"resolution": 4}
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.knee_spec() == lab.campaign.knee_search and lab.campaign.knee_limits() == (0.5, 0.4)
    campaign["knee_search"] = {"enabled": False}
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.knee_spec() is None


def test_an_older_campaign_keeps_its_knee_limits(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["knee_search"] = {"slo_p95_ttft_s": 2.0}
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.knee_limits() == (2.0, None) and lab.campaign.knee_spec() is not None
    del campaign["knee_search"]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.knee_spec() is None and lab.campaign.knee_limits() == (None, None)


def test_the_target_and_prices_keep_the_cell_ids(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    before = [
        c.id
        for c in resolve_cells(
            load_lab(write_yaml("h.yml", inventory), write_yaml("c.yml", campaign)).campaign
        )
    ]
    campaign["slo"] = {"ttft_p95_s": 0.5}
    campaign["prices"] = {"node_hour": 12.0, "example": True}
    lab = load_lab(write_yaml("h.yml", inventory), write_yaml("c.yml", campaign))
    cells = resolve_cells(lab.campaign)
    # the first repeat's cells keep their ids; a decision adds two repeats of each (issue 53)
    assert [c.id for c in cells if c.repeat == 1] == before
    assert lab.campaign.repeats == SLO_REPEATS == 3 and len(cells) == 3 * len(before)
    assert lab.campaign.prices == Prices(node_hour=12.0, example=True)
    # a campaign that names its repeats keeps them, slo or not
    campaign["repeats"] = 1
    lab = load_lab(write_yaml("h.yml", inventory), write_yaml("c.yml", campaign))
    assert [c.id for c in resolve_cells(lab.campaign)] == before


def test_a_lab_s_prices_come_from_the_campaign_or_its_nodes() -> None:
    mine = Prices(node_hour=10.0)
    assert lab_prices(mine, "c.yml: prices", [("h2", {}, "")]) == (mine, "c.yml: prices")
    assert lab_prices(None, "c.yml: prices", [("h2", {}, "")]) == (None, None)
    node = {"kvoffload_prices": {"gpu_hour": 2.5}}
    where = "hosts.yml: all.vars.kvoffload_prices"
    assert lab_prices(None, "c.yml: prices", [("h2", node, where), ("h3", node, where)]) == (
        Prices(gpu_hour=2.5),
        where,
    )
    with pytest.raises(KeyedError) as both:
        lab_prices(mine, "c.yml: prices", [("h2", node, where)])
    assert both.value.key == "c.yml: prices"
    assert str(both.value).startswith(
        f"prices are given twice: here and as kvoffload_prices of the nodes ({where})"
    )
    other = {"kvoffload_prices": {"gpu_hour": 3.0}}
    with pytest.raises(KeyedError) as differ:
        lab_prices(
            None, "c.yml: prices", [("h2", node, where), ("h3", other, "host_vars/h3.yml: kvoffload_prices")]
        )
    assert differ.value.key == "host_vars/h3.yml: kvoffload_prices"
    assert "host h3's kvoffload_prices differs from host h2's" in str(differ.value)
    with pytest.raises(KeyedError, match="host h2: gpu_hours: Extra inputs are not permitted"):
        lab_prices(None, "c.yml: prices", [("h2", {"kvoffload_prices": {"gpu_hours": 1.0}}, where)])


def test_load_lab_takes_the_prices_from_the_inventory(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    inventory["all"]["vars"]["kvoffload_prices"] = {"node_hour": 30.0, "currency": "EUR"}
    inv = write_yaml("hosts.yml", inventory)
    lab = load_lab(inv, write_yaml("campaign.yml", campaign))
    assert lab.prices == Prices(node_hour=30.0, currency="EUR")
    assert lab.prices_source == f"{inv}: all.vars.kvoffload_prices"
    campaign["prices"] = {"node_hour": 10.0}
    with pytest.raises(ConfigError) as info:
        load_lab(inv, write_yaml("campaign.yml", campaign))
    assert str(info.value).startswith(
        f"{inv.parent / 'campaign.yml'}: prices: prices are given twice: here and as kvoffload_prices of the "
        f"nodes ({inv}: all.vars.kvoffload_prices)"
    )


def test_missing_prices_name_what_each_tier_would_lack() -> None:
    from kvoffload.config.slo import Prices, missing_prices

    [none] = missing_prices(None, ["gpu", "cpu", "nvme"])
    assert "no prices" in none and "gpu_hour, dram_gb_month, nvme_tb_month" in none
    assert missing_prices(None, ["gpu"])[0].endswith("give node_hour or gpu_hour")
    assert missing_prices(Prices(node_hour=4.0), ["gpu", "cpu", "nvme"]) == []
    gpu_only = missing_prices(Prices(gpu_hour=2.5), ["gpu", "cpu", "nvme"])
    assert [w.split(" (")[0] for w in gpu_only] == ["prices: no dram_gb_month", "prices: no nvme_tb_month"]
    assert missing_prices(Prices(gpu_hour=2.5, dram_gb_month=0.5), ["gpu", "cpu"]) == []
    assert "no tier has a cost" in missing_prices(Prices(kwh=0.1), ["gpu"])[0]
