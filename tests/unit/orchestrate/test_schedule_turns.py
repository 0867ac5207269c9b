"""The order of a node's cells when a campaign repeats (issue 53): repeat by repeat, the tier order
turning round between repeats, and the engines restarted only where the tier changes."""

from __future__ import annotations

from kvoffload.config.campaign import Campaign
from kvoffload.config.cells import resolve_cells
from kvoffload.orchestrate.campaign.schedule import schedule

CAMPAIGN = {
    "name": "t", "model": "m", "gpu_vendor": "nvidia", "engine": "sim", "sim_profile": "tiny",
    "dataset": {"code": "generic", "path": "d"}, "tiers": ["gpu", "cpu", "nvme"], "concurrency": [2, 16],
    "num_rounds": [5], "isl": 1000, "repeats": 3,
}  # fmt: skip


def test_the_tier_order_turns_round_between_repeats_and_keeps_the_engines_at_each_boundary() -> None:
    cells = resolve_cells(Campaign.model_validate(CAMPAIGN))
    (plan,) = schedule(cells, ["n1"])
    order = [(c.repeat, c.tier, c.concurrency) for c in plan.cells]
    assert order == [
        (1, "gpu", 2), (1, "gpu", 16), (1, "cpu", 2), (1, "cpu", 16), (1, "nvme", 2), (1, "nvme", 16),
        (2, "nvme", 2), (2, "nvme", 16), (2, "cpu", 2), (2, "cpu", 16), (2, "gpu", 2), (2, "gpu", 16),
        (3, "gpu", 2), (3, "gpu", 16), (3, "cpu", 2), (3, "cpu", 16), (3, "nvme", 2), (3, "nvme", 16),
    ]  # fmt: skip
    # the engines change only where the tier does: 3 tiers x 3 repeats, less the 2 shared boundaries
    changes = sum(1 for a, b in zip(plan.cells, plan.cells[1:], strict=False) if a.tier != b.tier)
    assert changes == 6


def test_together_runs_a_cells_repeats_back_to_back_on_the_same_engines() -> None:
    """`repeat_order: together`: tier by tier as before issue 53, each cell's repeats one after the
    other (a reset between them, no redeploy), the engines changing twice in all; the ids are the same
    (the order is not hashed)."""
    together = Campaign.model_validate({**CAMPAIGN, "repeat_order": "together"})
    cells = resolve_cells(together)
    assert [c.id for c in cells] == [c.id for c in resolve_cells(Campaign.model_validate(CAMPAIGN))]
    (plan,) = schedule(cells, ["n1"], repeat_order=together.repeat_order)
    order = [(c.tier, c.concurrency, c.repeat) for c in plan.cells]
    assert order[:6] == [
        ("gpu", 2, 1),
        ("gpu", 2, 2),
        ("gpu", 2, 3),
        ("gpu", 16, 1),
        ("gpu", 16, 2),
        ("gpu", 16, 3),
    ]
    assert sum(1 for a, b in zip(plan.cells, plan.cells[1:], strict=False) if a.tier != b.tier) == 2
