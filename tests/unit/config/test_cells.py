"""Cell resolution: the matrix, its order, and ids that are stable short hashes of the config."""

from __future__ import annotations

from typing import Any

from kvoffload.config import Campaign, resolve_cells


def test_matrix_order_and_profiles(campaign: dict[str, Any]) -> None:
    campaign["tiers"] = ["nvme", "gpu"]
    campaign["num_rounds"] = [5, 10]
    campaign["repeats"] = 2
    cells = resolve_cells(Campaign.model_validate(campaign))
    assert len(cells) == 2 * 2 * 2 * 2
    assert [c.tier for c in cells[:8]] == ["gpu"] * 8
    assert (cells[0].concurrency, cells[0].num_rounds, cells[0].repeat) == (2, 5, 1)
    assert (cells[1].concurrency, cells[1].num_rounds, cells[1].repeat) == (2, 5, 2)
    assert cells[0].engine_profile == "nvidia-gpu" and cells[0].lmcache_profile is None
    assert cells[8].engine_profile == "nvidia-nvme" and cells[8].lmcache_profile == "nvme"
    assert len({c.id for c in cells}) == len(cells)
    assert all(len(c.id) == 10 and int(c.id, 16) >= 0 for c in cells)


def test_config_holds_the_resolved_values(campaign: dict[str, Any]) -> None:
    cell = resolve_cells(Campaign.model_validate(campaign))[-1]
    assert cell.config["tier"] == "nvme"
    assert cell.config["concurrency"] == 16
    assert cell.config["osl"] == 32
    assert cell.config["model"] == "tiny-llama"
    assert cell.config["dataset"] == {"code": "tau2-bench-v1", "path": "data/tau2"}
    assert "name" not in cell.config and "tiers" not in cell.config


def test_ids_are_stable_and_follow_the_config_not_the_name(campaign: dict[str, Any]) -> None:
    first = [c.id for c in resolve_cells(Campaign.model_validate(campaign))]
    renamed = [c.id for c in resolve_cells(Campaign.model_validate({**campaign, "name": "other"}))]
    other_model = [c.id for c in resolve_cells(Campaign.model_validate({**campaign, "model": "m2"}))]
    assert first == renamed
    assert not set(first) & set(other_model)
    # Pinned: an id change moves every result folder and breaks resume of existing campaigns.
    assert first[0] == "4577b9022c"


def test_optional_keys_at_their_default_do_not_change_ids(campaign: dict[str, Any]) -> None:
    plain = [c.id for c in resolve_cells(Campaign.model_validate(campaign))]
    explicit = {**campaign, "repeats": 1, "honor_gaps": False, "max_sessions": None, "extra_engine_args": []}
    assert [c.id for c in resolve_cells(Campaign.model_validate(explicit))] == plain
    capped = [c.id for c in resolve_cells(Campaign.model_validate({**campaign, "max_sessions": 8}))]
    assert not set(capped) & set(plain)


def test_l1_size_override_is_per_tier(campaign: dict[str, Any]) -> None:
    plain = {c.tier: c.id for c in resolve_cells(Campaign.model_validate(campaign)) if c.concurrency == 2}
    campaign["lmcache_l1_size_gb"] = {"nvme": 0.125}
    cells = [c for c in resolve_cells(Campaign.model_validate(campaign)) if c.concurrency == 2]
    by_tier = {c.tier: c for c in cells}
    assert by_tier["nvme"].lmcache_l1_size_gb == 0.125
    assert by_tier["cpu"].lmcache_l1_size_gb is None
    assert by_tier["gpu"].lmcache_l1_size_gb is None
    # Only the nvme cells' configuration changed, so only their ids move.
    assert by_tier["gpu"].id == plain["gpu"] and by_tier["cpu"].id == plain["cpu"]
    assert by_tier["nvme"].id != plain["nvme"]
