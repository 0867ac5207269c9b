"""Cells: the points of tiers x concurrency x num_rounds x isl x osl x repeat of a campaign.

A cell's id is a short hash of its resolved configuration (the campaign's fixed setup plus the cell's
own values, not the campaign name), so the same configuration always lands in the same
results/<campaign>/cells/<id>/ folder and resume can find it. Keys left at their default are not
hashed, so adding an optional campaign key later does not move existing results. Pure functions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from kvoffload.config.campaign import Campaign, Osl
from kvoffload.tiers import Tier

CELL_ID_LENGTH = 10


@dataclass(frozen=True)
class Cell:
    """One run of the campaign matrix."""

    id: str
    tier: Tier
    concurrency: int
    num_rounds: int
    isl: int
    osl: Osl
    repeat: int
    config: dict[str, Any]

    @property
    def engine_profile(self) -> str:
        """Engine profile name: `<gpu vendor>-<tier>` (kvoffload/profiles/engine/)."""
        return f"{self.config['gpu_vendor']}-{self.tier}"

    @property
    def lmcache_l1_size_gb(self) -> float | None:
        """The campaign's L1 size override for this cell's tier; None means the profile's size."""
        value = self.config["lmcache_l1_size_gb"]
        return None if value is None else float(value)

    @property
    def lmcache_profile(self) -> str | None:
        """lmcache-server profile (`cpu` or `nvme`); None on the gpu tier, which runs no server."""
        return None if self.tier == "gpu" else self.tier


# Keys that become per-cell values (or, for the L1 sizes, the value of the cell's tier).
# The knee search only decides which further cells run, the latency target and the prices only how the
# report reads them (issue 42), the repeat order only when cells run (issue 53): none is part of any
# cell's configuration, so adding them keeps ids.
_MATRIX_KEYS = (
    "name",
    "tiers",
    "concurrency",
    "num_rounds",
    "isl",
    "osl",
    "repeats",
    "lmcache_l1_size_gb",
    "knee_search",
    "slo",
    "prices",
    "repeat_order",
)


def _fixed_setup(campaign: Campaign, *, exclude_defaults: bool = False) -> dict[str, Any]:
    """Everything of the campaign that every cell shares (the lists become per-cell values)."""
    data = campaign.model_dump(mode="json", exclude_defaults=exclude_defaults)
    for key in _MATRIX_KEYS:
        data.pop(key, None)
    return data


def cell_id(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:CELL_ID_LENGTH]


def make_cell(
    campaign: Campaign, tier: Tier, concurrency: int, num_rounds: int, isl: int, osl: Osl, repeat: int
) -> Cell:
    """One cell of the campaign at these values (also a cell outside the campaign's lists, such as a
    step of its knee search)."""
    fixed = _fixed_setup(campaign)
    hashed = _fixed_setup(campaign, exclude_defaults=True)
    own: dict[str, Any] = {
        "tier": tier,
        "concurrency": concurrency,
        "num_rounds": num_rounds,
        "isl": isl,
        "osl": osl,
        "repeat": repeat,
    }
    sizes = campaign.lmcache_l1_size_gb
    l1: float | None = None if tier == "gpu" or sizes is None else getattr(sizes, tier)
    ident = cell_id({**hashed, **own, **({"lmcache_l1_size_gb": l1} if l1 is not None else {})})
    own["lmcache_l1_size_gb"] = l1
    return Cell(ident, tier, concurrency, num_rounds, isl, osl, repeat, {**fixed, **own})


def resolve_cells(campaign: Campaign) -> list[Cell]:
    """Every cell, ordered by tier (gpu, cpu, nvme) and then by the campaign's list order."""
    return [
        make_cell(campaign, tier, concurrency, rounds, isl, osl, repeat)
        for tier, concurrency, rounds, isl, osl, repeat in itertools.product(
            campaign.ordered_tiers(),
            campaign.concurrency,
            campaign.num_rounds,
            campaign.isl,
            campaign.osl,
            range(1, campaign.repeats + 1),
        )
    ]
