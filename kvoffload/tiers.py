"""The KV tiers: the one definition every layer (config, profiles, results contracts) imports.

A leaf module: no imports from the package, no IO.
"""

from __future__ import annotations

from typing import Literal

Tier = Literal["gpu", "cpu", "nvme"]
TIERS: tuple[Tier, ...] = ("gpu", "cpu", "nvme")  # the order tiers are run and reported in
